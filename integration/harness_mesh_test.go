package integration

import (
	"context"
	"regexp"
	"strings"
	"testing"
)

// The mesh: each node's SUP ports and which of them are cabled to a given peer, reading a
// node's counters on its ports, and the plugin's send-comm lines that name the port a
// connection chose.

// meshPorts are a node's SUP ports on the mesh: its cables (parallel ones first), and a1's
// and a2's SUP rail (their cable to each other, 10.9.1.0/24).
func meshPorts(n *Node) []Rail {
	var ports []Rail
	for _, r := range n.Links() {
		if strings.HasSuffix(string(r), "P") {
			ports = append([]Rail{r}, ports...)
		} else {
			ports = append(ports, r)
		}
	}
	if n.Name() == "a1" || n.Name() == "a2" {
		ports = append(ports, SUP)
	}
	return ports
}

// cablesBetween are a's rails whose cable ends at b.
func cablesBetween(a, b *Node) []Rail {
	var out []Rail
	for _, r := range meshPorts(a) {
		if r == SUP && (b.Name() == "a1" || b.Name() == "a2") || r == LinkRail(b.Name(), false) || r == LinkRail(b.Name(), true) {
			out = append(out, r)
		}
	}
	return out
}

var sendCommRe = regexp.MustCompile(`send comm .* SUP QPs (\d+), CTS on \w+, SUP pair (.+) on (\S+), traffic class`)

// railOfDev is the node's rail whose device is dev.
func railOfDev(n *Node, dev string) (Rail, bool) {
	for _, r := range meshPorts(n) {
		if n.Dev(r) == dev {
			return r, true
		}
	}
	return "", false
}

const meshPayload = 12 << 20

// meshCounters reads a node's counters on the given rails (default SOUT, SUP and SUP2).
func meshCounters(ctx context.Context, t *testing.T, n *Node, rails ...Rail) map[Rail]Counters {
	t.Helper()
	if len(rails) == 0 {
		rails = []Rail{SOUT, SUP, SUP2}
	}
	out, err := n.RailCounters(ctx, rails...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
