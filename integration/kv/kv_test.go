package kv

import (
	"math"
	"reflect"
	"testing"
)

// Lines as mpib-nettest and the plugin print them (values from lab runs).
const out = `nettest-init: role=server plugin=/opt/mpib/libnccl-net-mpib.so
nettest-connect: comms=64 total_s=2.315 longest_call_ms=41.2 verified=true role=server longest_connect_ms=12.0 round=1
nettest-resources: conns=64 per_conn_kib=412 verified=true role=server fds_closed=9 threads_closed=3 round=1
nettest-resources: conns=64 per_conn_kib=398 verified=true role=server fds_closed=9 threads_closed=4 round=2
nettest-lifecycle: case=abort-mid-transfer role=aborter inflight=8 rc=0 abort_mono=1234.567
nettest-lifecycle: case=abort-mid-transfer role=peer error=remote-closed error_mono=1234.901
nettest-lifecycle-exit: mono=1235.002
sniff: tx_tos=0x68 rx_tos=0x68 tx_dominant_tos=0x68 tx_packets=1200 note words without equals
`

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Record
	}{
		{"", Record{}},
		{"no fields here", Record{}},
		{"a=1 b=two", Record{"a": "1", "b": "two"}},
		{"  a=1\tb= c=x=y ", Record{"a": "1", "b": "", "c": "x=y"}},
		{"a=first a=second", Record{"a": "first"}},
		{"=v k=1", Record{"": "v", "k": "1"}},
	} {
		if got := Parse(c.in); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Parse(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestLines(t *testing.T) {
	rs := Lines(out, "nettest-resources:")
	if len(rs) != 2 || rs[0]["per_conn_kib"] != "412" || rs[1]["threads_closed"] != "4" || rs[1]["round"] != "2" {
		t.Errorf("resources lines = %v", rs)
	}
	if rs := Lines(out, "nettest-stall:"); rs != nil {
		t.Errorf("no stall line, got %v", rs)
	}
	// The prefix selects: its own fields are not part of the record.
	rs = Lines(out, "nettest-lifecycle: case=abort-mid-transfer role=peer")
	if len(rs) != 1 || rs[0]["error"] != "remote-closed" || rs[0]["role"] != "" {
		t.Errorf("peer line = %v", rs)
	}
}

func TestField(t *testing.T) {
	for _, c := range []struct {
		prefix, key, want string
	}{
		{"nettest-connect:", "comms", "64"},
		{"nettest-connect:", "verified", "true"},
		{"nettest-resources:", "per_conn_kib", "412"}, // the first line
		{"nettest-lifecycle: case=abort-mid-transfer role=aborter", "inflight", "8"},
		{"nettest-lifecycle: case=abort-mid-transfer role=peer", "inflight", ""},
		{"nettest-lifecycle:", "mono", ""}, // not nettest-lifecycle-exit:
		{"nettest-lifecycle-exit:", "mono", "1235.002"},
		{"sniff:", "tx_dominant_tos", "0x68"},
		{"sniff:", "tx_tos", "0x68"}, // a key, not a key's prefix
		{"sniff:", "note", ""},
		{"nettest-stall:", "end_ms", ""},
	} {
		if got := Field(out, c.prefix, c.key); got != c.want {
			t.Errorf("Field(%q, %q) = %q, want %q", c.prefix, c.key, got, c.want)
		}
	}
}

func TestFloat(t *testing.T) {
	if v, ok := Float(out, "nettest-lifecycle: case=abort-mid-transfer role=aborter", "abort_mono"); !ok || v != 1234.567 {
		t.Errorf("abort_mono = %v %v", v, ok)
	}
	if _, ok := Float(out, "nettest-lifecycle: case=abort-mid-transfer role=peer", "error"); ok {
		t.Error("a word read as a number")
	}
	r := First(out, "nettest-resources:")
	if r.Float("fds_closed") != 9 || !math.IsNaN(r.Float("missing")) || !math.IsNaN(r.Float("verified")) {
		t.Errorf("Record.Float on %v", r)
	}
	if First(out, "absent:") != nil || !math.IsNaN(First(out, "absent:").Float("x")) {
		t.Error("First of a missing line is not nil")
	}
}

func TestLine(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{Line("fault:", "case=%s rail=%s stall_ms=%d verified=%v", "glitch", "SUP", 12, true), "fault: case=glitch rail=SUP stall_ms=12 verified=true\n"},
		{Line("P1", "size=%d ratio=%.3f", 65536, 0.98765), "P1 size=65536 ratio=0.988\n"},
		{Line("demo:", "phase 1, vanilla (MPIB_MODE=0)"), "demo: phase 1, vanilla (MPIB_MODE=0)\n"},
	} {
		if c.got != c.want {
			t.Errorf("Line = %q, want %q", c.got, c.want)
		}
	}
	out := Line("leak:", "cycles=%d kind=%s", 200, "connect-close")
	if Field(out, "leak:", "kind") != "connect-close" || Field(out, "leak:", "cycles") != "200" {
		t.Errorf("Field does not read back what Line wrote: %q", out)
	}
}

func TestContaining(t *testing.T) {
	log := "  a x\nb\nc y x\n\nd y\n"
	for _, c := range []struct {
		markers []string
		want    []string
	}{
		{[]string{"x"}, []string{"a x", "c y x"}},
		{[]string{"x", "y"}, []string{"a x", "c y x", "d y"}}, // a line matching two markers once
		{[]string{"z"}, nil},
		{nil, nil},
	} {
		if got := Containing(log, c.markers...); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Containing(%q) = %q, want %q", c.markers, got, c.want)
		}
	}
}
