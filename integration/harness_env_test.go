package integration

import (
	"strings"
)

// A node's plugin environment. Every lab test configures the plugin of a node through
// nodeEnv: the devices of its two rails, its SOUT netdev for the control path, INFO logging
// (the tests read the plugin's lines), the lab's RC try (labRetransmitTimeout), then the
// test's settings in order. The lab runner
// applies the entries in order, so of two values of one key the later holds: settings come
// after the base and a caller's extras after a builder's own.

// hcas are the device lists of the plugin's two rails (MPIB_HCA_SOUT, MPIB_HCA_SUP): one
// device each, or several joined by "," (devices of one rail) or "+" (ports of a mesh).
type hcas struct{ sout, sup string }

// ownHCAs are node n's own SOUT and SUP devices.
func ownHCAs(n *Node) hcas { return hcas{n.Dev(SOUT), n.Dev(SUP)} }

// railEnv is what selects node n's rails: devices h, and its SOUT netdev for the control path.
func railEnv(n *Node, h hcas) []string {
	return []string{"MPIB_HCA_SOUT=" + h.sout, "MPIB_HCA_SUP=" + h.sup, "MPIB_OOB_IF=" + n.Netdev(SOUT)}
}

// nodeEnv is node n's plugin environment with devices h, then settings in order.
func nodeEnv(n *Node, h hcas, settings ...string) []string {
	return append(append(railEnv(n, h), "NCCL_DEBUG=INFO", labRetransmitTimeout), settings...)
}

// pluginEnv is node n's own two devices, the lab's watch limit for tests that judge a split
// (labSplitDetect), plus extra settings.
func pluginEnv(n *Node, extra ...string) []string {
	return nodeEnv(n, ownHCAs(n), append([]string{labSplitDetect}, extra...)...)
}

// labSplitDetect is the no-progress watch's limit for the tests that judge a split, a rate, a
// setup or a lifecycle, not the detection of a fault (pluginEnv's): 3 s instead of 600 ms.
// The watch counts completions of signalled writes, one per message, and the lab's rails are
// a hundred times slower than a real one: a 4 MiB message (verifyArgs) takes 80-700 ms on a
// loaded lab, where it takes under 4 ms at 10 Gbit/s; past the limit the watch fails the rail
// over and the split being judged is the failover's. The fault cases (faultEnv), the
// multi-device failover and the mesh tests keep the plugin's 600 ms: they measure detection,
// or cut links the port events report at once (TestMeshPortFailover's uncut connection,
// judged on having no rail event, and TestMultiDeviceConcurrent's rate take this one).
const labSplitDetect = "MPIB_DETECT_MS=3000"

// labRetransmitTimeout is the lab's RC try, not the plugin's default (net_ib's 4.3 s): 268 ms
// (4.096 us x 2^16), seven tries (MPIB_IB_RETRY_CNT's 6 retries) before the transport gives
// up, still well behind the no-progress watch's 600 ms. Soft-RoCE drops a packet now and then
// on a healthy link and retransmits it only when the try expires, where an mlx5 NIC
// retransmits within milliseconds (adaptive retransmission) on a fabric that hardly drops.
// With the 4.3 s try one such drop is 4.3 s without an acknowledgement, which the watch
// rightly fails over: a test that judges a split, a rate or the detection of a fault it
// injects would judge the lab's drops instead. The congestion case sets net_ib's try again
// (what a deep queue meets on a cluster), and the closed loop its own detection settings.
const labRetransmitTimeout = "MPIB_IB_TIMEOUT=16"

// faultEnv is the plugin configuration of the fault cases: the plugin's own detection default
// (the no-progress watch, MPIB_DETECT_MS), failover on, the mode's settings and extras (the
// last value of a key wins).
func faultEnv(n *Node, mode string, extra ...string) []string {
	settings := []string{"MPIB_FAILOVER=1"}
	switch mode {
	case "vanilla":
		settings = append(settings, "MPIB_MODE=0")
	case "advanced": // no agent: vanilla split, so force both rails busy
		settings = append(settings, "MPIB_MODE=1", "MPIB_FORCE_SUP_BW=512")
	}
	return nodeEnv(n, ownHCAs(n), append(settings, extra...)...)
}

// meshEnv is a mesh node's environment: its SOUT device, the SUP ports sup ("+"-joined),
// vanilla mode.
func meshEnv(n *Node, sup string) []string {
	return nodeEnv(n, hcas{n.Dev(SOUT), sup}, "MPIB_MODE=0")
}

// mdEnv is a node's plugin environment with both fused devices.
func mdEnv(n *Node, extra ...string) []string {
	return nodeEnv(n, hcas{n.Dev(SOUT) + "," + n.Dev(SOUT2), n.Dev(SUP) + "," + n.Dev(SUP2)}, extra...)
}

func meshFabricEnv(n *Node, relay bool) []string {
	devs := make([]string, 0, 4)
	for _, r := range meshPorts(n) {
		devs = append(devs, n.Dev(r))
	}
	return nodeEnv(n, hcas{n.Dev(SOUT), strings.Join(devs, "+")}, "MPIB_MODE=0", "MPIB_SUP_RELAY="+map[bool]string{true: "1", false: "0"}[relay])
}
