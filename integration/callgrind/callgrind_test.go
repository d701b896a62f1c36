package callgrind

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A trimmed callgrind file with the shapes that matter: compressed names defined on a cfn=
// line and reused, relative positions, two callers of one function.
const callgrindSample = `version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 5000

ob=(1) /opt/mpib/mpib-nettest
fl=(1) ???
fn=(1) run_bw
0 40
cob=(2) /opt/mpib/libnccl-net-mpib.so
cfi=(2) ???
cfn=(2) isend_v10
calls=3 0
0 900
cfn=(3) mpib_test
calls=10 0
+2 1500

fn=(4) drain
0 5
cfn=(3)
calls=2 0
* 200
cfn=(2)
calls=1 0
-1 310
`

func TestParseCalls(t *testing.T) {
	got, err := ParseCalls(strings.NewReader(callgrindSample))
	require.NoError(t, err)
	require.Equal(t, CallCost{Calls: 4, Ir: 1210}, got["isend_v10"])
	require.Equal(t, CallCost{Calls: 12, Ir: 1700}, got["mpib_test"])

	// With --dump-instr=yes each position is an address and a line.
	withInstr := strings.NewReplacer("positions: line", "positions: instr line", "\n0 ", "\n0x10 0 ",
		"\n+2 ", "\n+4 +2 ", "\n* ", "\n* * ", "\n-1 ", "\n-8 -1 ").Replace(callgrindSample)
	got, err = ParseCalls(strings.NewReader(withInstr))
	require.NoError(t, err)
	require.Equal(t, CallCost{Calls: 4, Ir: 1210}, got["isend_v10"])
	require.Equal(t, CallCost{Calls: 12, Ir: 1700}, got["mpib_test"])

	arcs, err := ParseArcs(strings.NewReader(callgrindSample))
	require.NoError(t, err)
	require.Equal(t, CallCost{Calls: 3, Ir: 900}, arcs[Arc{Caller: "run_bw", Callee: "isend_v10"}])
	require.Equal(t, CallCost{Calls: 1, Ir: 310}, arcs[Arc{Caller: "drain", Callee: "isend_v10"}])
	require.Equal(t, CallCost{Calls: 2, Ir: 200}, arcs[Arc{Caller: "drain", Callee: "mpib_test"}])
	require.Len(t, arcs, 4)

	_, err = ParseCalls(strings.NewReader("events: Ir\nfn=(1) main\n0 10\n"))
	require.ErrorContains(t, err, "no call arcs")
	_, err = ParseCalls(strings.NewReader("cfn=(1) f\ncalls=x 0\n0 1\n"))
	require.ErrorContains(t, err, "bad calls line")
}
