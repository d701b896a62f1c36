package integration

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/kv"
)

// NCCL compatibility knobs observed on the wire: the IPv4 TOS byte of the RoCE v2 packets
// (UDP port 4791) a node sends on a rail while a transfer runs, counted by
// `mpib-nettest --mode sniff` (an AF_PACKET socket in the node). The pair is inter-island,
// a1 -> b1, so data and the receiver's CTS writes both travel on SOUT. Data packets carry the
// sender's traffic class; what the receiver sends (CTS writes and ACKs) carries
// NCCL_IB_FIFO_TC when set, else the connection's traffic class.

// sniffTOS runs the sniffer on node n's rail during fn, until it has seen maxPackets RoCE v2
// packets (both directions) or 90 s, and returns its result line.
func sniffTOS(ctx context.Context, t *testing.T, n *Node, r Rail, maxPackets int, fn func()) string {
	t.Helper()
	p, err := n.Start(ctx, nil, nettestBin, "--mode", "sniff", "--iface", n.Netdev(r), "--seconds", "90",
		"--max-packets", strconv.Itoa(maxPackets))
	if err != nil {
		t.Fatal(err)
	}
	fn()
	e := waitExit(p, time.Now().Add(2*time.Minute))
	line := hasLine(e.out, "sniff:")
	if e.code != 0 || line == "" {
		t.Fatalf("sniffer on %s %s failed:\n%s", n.Name(), n.Netdev(r), e)
	}
	return line
}

func TestCompatTrafficClass(t *testing.T) {
	lab := labOrSkip(t)
	a1, b1 := lab.Node("a1"), lab.Node("b1")
	cases := []struct {
		knob     string
		value    int
		env      []string // on both nodes
		args     []string // for both drivers
		receiver bool     // sniff what the receiver sends (else the sender)
	}{
		// Control: MPIB's own knob, which sets every QP's traffic class. It proves the sniffer
		// reads the TOS the plugin sets, so a failure below is the plugin's.
		{knob: "MPIB_IB_TC", value: 106, env: []string{"MPIB_IB_TC=106"}},
		{knob: "NCCL_IB_TC", value: 106, env: []string{"NCCL_IB_TC=106"}},
		{knob: "NCCL_IB_FIFO_TC", value: 184, env: []string{"NCCL_IB_FIFO_TC=184"}, receiver: true},
		{knob: "comm-config", value: 72, args: []string{"--traffic-class", "72"}},
	}
	for _, c := range cases {
		t.Run(c.knob, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			// A receiver sends a few percent of the packets (CTS writes, ACKs): sniff longer there.
			node, maxPackets, minTx := a1, 3000, 1000
			if c.receiver {
				node, maxPackets, minTx = b1, 8000, 40
			}
			// 16 MiB is ~16,000 RoCE packets: enough for both limits, and the sniffer stops at
			// maxPackets instead of its 90 s limit.
			args := lcArgs(append([]string{"--mode", "verify", "--bytes", "16M", "--max-size", "1M", "--window", "8"}, c.args...)...)
			var res pairResult
			line := sniffTOS(ctx, t, node, SOUT, maxPackets, func() {
				res = runPair(ctx, t, b1, a1, pluginEnv(b1, c.env...), pluginEnv(a1, c.env...), args...)
			})
			observed := kv.Field(line, "sniff:", "tx_dominant_tos")
			evidence("compat:", "knob=%s value=%d rail=SOUT observed_tos=%s node=%s tx_tos=%s rx_tos=%s",
				c.knob, c.value, observed, node.Name(), kv.Field(line, "sniff:", "tx_tos"), kv.Field(line, "sniff:", "rx_tos"))
			verified(t, res)
			if n, _ := strconv.Atoi(kv.Field(line, "sniff:", "tx_packets")); n < minTx {
				t.Fatalf("the sniffer saw only %d RoCE v2 packets sent by %s during the transfer: %s", n, node.Name(), line)
			}
			if observed != strconv.Itoa(c.value) {
				t.Errorf("%s=%d: packets %s sent on SOUT carry TOS %s, want %d: %s", c.knob, c.value, node.Name(), observed, c.value, line)
			}
			if rails := ctsRails(res.serverErr); len(rails) == 0 || rails[0] != "SOUT" {
				t.Errorf("receiver's CTS rail = %v, want SOUT for the inter-island pair", rails)
			}
		})
	}
}
