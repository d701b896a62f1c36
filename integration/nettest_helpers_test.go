package integration

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// Helpers that run mpib-nettest pairs in the lab and measure rail counters around them.

const nettestBin = NodeBuildDir + "/mpib-nettest"
const pluginLib = NodeBuildDir + "/libnccl-net-mpib.so"

var oobPort atomic.Int32

func init() { oobPort.Store(18600) }

// railSample is the sender's and receiver's counters on both rails.
type railSample map[string]map[Rail]Counters

func sampleRails(ctx context.Context, nodes ...*Node) (railSample, error) {
	s := railSample{}
	for _, n := range nodes {
		s[n.Name()] = map[Rail]Counters{}
		for _, r := range Rails {
			c, err := n.Counters(ctx, r)
			if err != nil {
				return nil, err
			}
			s[n.Name()][r] = c
		}
	}
	return s, nil
}

// pairResult is one finished server/client run.
type pairResult struct {
	serverOut, serverErr   string
	clientOut, clientErr   string
	serverCode, clientCode int
	// tx is the bytes each node transmitted per rail during the run (netdev statistics).
	tx map[string]map[Rail]uint64
}

func (p pairResult) String() string {
	return fmt.Sprintf("server exit %d\n--- stdout\n%s\n--- stderr\n%s\nclient exit %d\n--- stdout\n%s\n--- stderr\n%s",
		p.serverCode, p.serverOut, tail(p.serverErr, 4000), p.clientCode, p.clientOut, tail(p.clientErr, 4000))
}

// nettestPair describes one nettest server/client pair (the client sends).
type nettestPair struct {
	server, client       *Node
	serverEnv, clientEnv []string // the whole environment (see pluginEnv)
	clientWrap           []string // a command the client runs under (valgrind), or none
	args                 []string // options for both sides after --plugin and the role
	serverLib, clientLib string   // the plugin each side loads (default pluginLib)
}

// startPair starts the server, then the client connecting to it over a fresh OOB port.
func startPair(ctx context.Context, t *testing.T, p nettestPair) (srv, cli *Process) {
	t.Helper()
	port := strconv.Itoa(int(oobPort.Add(1)))
	lib := func(l string) []string {
		if l == "" {
			l = pluginLib
		}
		return append([]string{"--plugin", l}, p.args...)
	}
	srv, err := p.server.Start(ctx, p.serverEnv, append([]string{nettestBin, "--role", "server", "--oob-listen", p.server.IP(SOUT) + ":" + port}, lib(p.serverLib)...)...)
	if err != nil {
		t.Fatal(err)
	}
	clientCmd := append(append([]string(nil), p.clientWrap...), nettestBin, "--role", "client", "--oob-connect", p.server.IP(SOUT)+":"+port)
	cli, err = p.client.Start(ctx, p.clientEnv, append(clientCmd, lib(p.clientLib)...)...)
	if err != nil {
		srv.Kill(context.Background())
		t.Fatal(err)
	}
	return srv, cli
}

// waitPair waits for both drivers of a pair and returns their outputs; when either does not
// end (ctx), it kills both and fails the test, naming what.
func waitPair(ctx context.Context, t *testing.T, srv, cli *Process, what string) pairResult {
	t.Helper()
	var res pairResult
	var cerr, serr error
	res.clientOut, res.clientErr, res.clientCode, cerr = cli.Wait(ctx)
	res.serverOut, res.serverErr, res.serverCode, serr = srv.Wait(ctx)
	if cerr != nil || serr != nil {
		srv.Kill(context.Background())
		cli.Kill(context.Background())
		t.Fatalf("%s did not finish: client %v, server %v", what, cerr, serr)
	}
	return res
}

// runPair runs a nettest server on `server` and a client on `client` (the client sends).
func runPair(ctx context.Context, t *testing.T, server, client *Node, serverEnv, clientEnv []string, args ...string) pairResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	before, err := sampleRails(ctx, server, client)
	if err != nil {
		t.Fatal(err)
	}
	srv, cli := startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: serverEnv, clientEnv: clientEnv,
		args: append([]string{"--timeout-s", "90"}, args...)})
	res := waitPair(ctx, t, srv, cli, "nettest")
	after, err := sampleRails(ctx, server, client)
	if err != nil {
		t.Fatal(err)
	}
	res.tx = map[string]map[Rail]uint64{}
	for name, rails := range after {
		res.tx[name] = map[Rail]uint64{}
		for r, c := range rails {
			res.tx[name][r] = c.TxBytes - before[name][r].TxBytes
		}
	}
	return res
}

var resultRe = regexp.MustCompile(`nettest-result: role=(\w+) mode=verify messages=(\d+) payload_bytes=(\d+) verified=(\w+)`)

// verified returns the receiver's payload byte count, failing the test unless both sides
// finished cleanly and the receiver verified every byte.
func verified(t *testing.T, res pairResult) uint64 {
	t.Helper()
	if res.serverCode != 0 || res.clientCode != 0 {
		t.Fatalf("nettest failed:\n%s", res)
	}
	m := resultRe.FindStringSubmatch(res.serverOut)
	if m == nil || m[4] != "true" {
		t.Fatalf("receiver did not report verified=true:\n%s", res)
	}
	n, _ := strconv.ParseUint(m[3], 10, 64)
	return n
}

// supQPs reads the SUP QP count the plugin logged for its connection ("SUP QPs N").
func supQPs(t *testing.T, log string) []int {
	t.Helper()
	var counts []int
	for _, m := range regexp.MustCompile(`SOUT QPs (\d+), SUP QPs (\d+), CTS on (\w+)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[2])
		counts = append(counts, n)
	}
	if len(counts) == 0 {
		t.Fatalf("no connection line in the plugin log:\n%s", tail(log, 3000))
	}
	return counts
}

func ctsRails(log string) []string {
	var rails []string
	for _, m := range regexp.MustCompile(`recv comm .*CTS on (\w+)`).FindAllStringSubmatch(log, -1) {
		rails = append(rails, m[1])
	}
	return rails
}

func pairName(a, b *Node) string { return a.Name() + "-" + b.Name() }

func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}
