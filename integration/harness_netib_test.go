package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The net_ib reference of the benchmarks: NCCL's IB transport as Mellanox's
// nccl-rdma-sharp-plugins ports it (its IBext plugin), which the benchmarks that compare
// connection setup, memory and the send path's instructions run beside MPIB in the same lab
// boot, over the same soft-RoCE devices, with the same driver. scripts/build_netib_ref.sh
// builds it into build/ from a checkout (`go run mage.go bench` does, when MPIB_NETIB_REF_SRC
// names one); without it those benchmarks measure MPIB alone and say why.

// netibRefFile is the reference's name in build/ (the nodes see it in NodeBuildDir).
const netibRefFile = "libnccl-net-netib-ref.so"

// underTest is a plugin a benchmark drives: its library in the nodes and each node's
// environment for it.
type underTest struct {
	name string // mpib or netib
	lib  string
	env  func(n *Node, extra ...string) []string
}

// mpibUnderTest is MPIB with the lab's usual environment (pluginEnv).
var mpibUnderTest = underTest{name: "mpib", lib: pluginLib, env: pluginEnv}

// netibUnderTest is the net_ib reference on the node's SOUT device (one rail: what net_ib
// drives), its control connections on that rail's netdev, and the lab's RC timeout
// (labRetransmitTimeout's value: NCCL_IB_TIMEOUT has the same scale).
var netibUnderTest = underTest{name: "netib", lib: NodeBuildDir + "/" + netibRefFile, env: netibEnv}

func netibEnv(n *Node, extra ...string) []string {
	return append([]string{"NCCL_IB_HCA==" + n.Dev(SOUT), "NCCL_SOCKET_IFNAME=" + n.Netdev(SOUT), "NCCL_DEBUG=WARN",
		"NCCL_IB_TIMEOUT=" + strings.TrimPrefix(labRetransmitTimeout, "MPIB_IB_TIMEOUT=")}, extra...)
}

// netibRef reports whether the reference is built (the tests run in integration/, beside
// build/); when it is not, it logs how to build it.
func netibRef(t *testing.T) bool {
	t.Helper()
	if _, err := os.Stat(filepath.Join("..", "build", netibRefFile)); err != nil {
		evidence("netib-ref:", "absent (build/%s: %v); go run mage.go bench builds it when MPIB_NETIB_REF_SRC names a checkout of github.com/Mellanox/nccl-rdma-sharp-plugins (docs/benchmarks.md)", netibRefFile, err)
		return false
	}
	return true
}
