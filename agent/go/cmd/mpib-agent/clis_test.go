package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// cli is one agent's command line.
type cli struct {
	name string
	cmd  []string
	env  []string
}

// pythonCLI is the Python agent from this tree (agent/python/src: standard library only).
func pythonCLI(t *testing.T) cli {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found: the CLI comparison needs it")
	}
	src, _ := filepath.Abs("../../../python/src")
	return cli{"python", []string{py, "-m", "mpib_agent"}, []string{"PYTHONPATH=" + src}}
}

func (c cli) command(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.cmd[0], append(c.cmd[1:], args...)...)
	cmd.Env = append(append(os.Environ(), c.env...), env...)
	return cmd
}

func (c cli) run(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := c.command(env, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("%s %v: %v", c.name, args, err)
	}
	return o.String(), e.String(), code
}

var errLineRe = regexp.MustCompile(`(?m)^mpib-agent(?:-py)? [a-z]+: ([a-z_]+): `)

// errCodeOf is the CODE of the "PROG CMD: CODE: message" line ("" when none).
func errCodeOf(stderr string) string {
	if m := errLineRe.FindStringSubmatch(stderr); m != nil {
		return m[1]
	}
	return ""
}

// normalize makes two runs' outputs comparable: program name, segment paths, pids, ages.
var (
	ageRe = regexp.MustCompile(`last beat -?[0-9]+ ms ago`)
	pidRe = regexp.MustCompile(`pid [0-9]+`)
)

func normalize(s string, paths ...string) string {
	s = strings.ReplaceAll(s, "mpib-agent-py", "mpib-agent")
	for _, p := range paths {
		s = strings.ReplaceAll(s, p, "SEG")
	}
	s = ageRe.ReplaceAllString(s, "last beat N ms ago")
	return pidRe.ReplaceAllString(s, "pid N")
}

// fixture is one segment with connections registered by this process (a fake plugin: its
// leases are held by this test process) and a heartbeat that stays fresh for the CLIs
// (MPIB_AGENT_STALE_MS=600000).
type fixture struct {
	path string
	seg  *shm.Segment
	plug *emulate.Plugin // the connections' side
	a, b uint32          // a: inter-island send, registered twice (gen 2); b: intra-island send
}

const cliEnvStale = "MPIB_AGENT_STALE_MS=600000"

func newFixture(t *testing.T, dir, name string) *fixture {
	t.Helper()
	f := &fixture{path: filepath.Join(dir, name)}
	seg, err := shm.Create(f.path, 8, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	f.seg, f.plug = seg, attachPlugin(t, f.path)
	reg := func(conn uint64, peer string, class shm.PathClass, send bool) uint32 {
		ip, _ := shm.ParseIPv4(peer)
		local, _ := shm.ParseIPv4("10.0.1.1")
		s, err := f.plug.Register(emulate.ConnDesc{LocalSoutIP: local, PeerSoutIP: ip, PeerIsland: ip & 0xFFFFFF00,
			PathClass: class, IsSend: send, NQPsSout: 1, NQPsSup: 2, PID: 4242, ConnID: conn})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	f.a = reg(1, "10.0.2.7", shm.InterIsland, true)
	f.plug.Release(f.a)
	f.a = reg(1, "10.0.2.7", shm.InterIsland, true) // gen 2
	f.b = reg(2, "10.0.1.5", shm.IntraIsland, true)
	reg(3, "10.0.2.8", shm.InterIsland, false)
	seg.Beat(shm.Now())
	return f
}

// state is the segment's hints and slots without the fields that differ between two runs
// (timestamps, seqlock counters, pids of beats).
func (f *fixture) state(t *testing.T) string {
	t.Helper()
	snap, err := f.seg.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	clean := func(r *shm.Record) { r.SetNs, r.Seq = 0, 0 }
	for i := range snap.Class {
		clean(&snap.Class[i])
	}
	for i := range snap.Peers {
		clean(&snap.Peers[i].Record)
	}
	for i := range snap.Slots {
		clean(&snap.Slots[i].Hint)
		snap.Slots[i].RegisteredNs = 0
	}
	snap.Header = shm.Header{PeersEpoch: snap.Header.PeersEpoch}
	b, _ := json.MarshalIndent(snap, "", " ")
	return string(b)
}

type outcome struct {
	stdout, code string
	exit         int
	state        string
}

// TestCLIsAgree runs the Go and the Python CLI with the same arguments, each on its own copy
// of one segment (same connections, same state), and requires the same exit status, the same
// error code, the same output and the same resulting segment; `list --json` on one segment
// must print the same JSON. (Defect 7: the two CLIs differed in list --json fields and types,
// --interval forms, --capacity validation, fractional weights, static conns entries for
// connections that appear later, path class printing, and a deleted static key stayed in
// force.)
func TestCLIsAgree(t *testing.T) {
	goCLI := cli{"go", []string{agentBin(t)}, nil}
	pyCLI := pythonCLI(t)
	dir := t.TempDir()
	env := []string{cliEnvStale}

	// list --json: one segment, the same bytes.
	f := newFixture(t, dir, "listed")
	f.seg.SetClassHint(shm.InterIsland, 300, true)
	f.plug.AddTelemetry(f.a, 1, 12345)
	f.plug.SetRailState(f.a, 1, shm.RailDown, 1_763_856_000_123_456_789) // SUP failed over
	f.plug.SetRailState(f.b, 0, shm.RailFailed, 1_763_856_001_000_000_000)
	f.plug.SetRailState(f.b, 1, shm.RailState(9), 7) // a state this agent does not know
	f.plug.FlushTelemetry(f.a, emulate.TelemetryBatch{AppliedSupBw: 300, WallNs: 1_763_856_000_999_999_999,
		Rails: [2]emulate.RailBatch{{CompletedBytes: 1 << 40, CompletedRequests: 9, BusyNs: 1<<63 + 1, InflightBytes: 77},
			{CompletedBytes: 5, CompletedRequests: 1, BusyNs: 6, InflightBytes: 0xFFFFFFFFFFFFFFFF}}})
	gOut, gErr, gCode := goCLI.run(t, env, "list", "--json", "--path", f.path)
	pOut, pErr, pCode := pyCLI.run(t, env, "list", "--json", "--path", f.path)
	if gCode != 0 || pCode != 0 || gOut != pOut {
		t.Fatalf("list --json differs:\n--- go (%d) %s\n%s\n--- python (%d) %s\n%s", gCode, gErr, gOut, pCode, pErr, pOut)
	}
	var listed []map[string]any
	if err := json.Unmarshal([]byte(gOut), &listed); err != nil || len(listed) != 3 {
		t.Fatalf("list --json: %v %s", err, gOut)
	}
	if eff := listed[0]["effective"]; !reflect.DeepEqual(eff, map[string]any{"applies": true, "sup_bw": 300.0, "source": "class", "clamped": false}) &&
		!reflect.DeepEqual(eff, map[string]any{"applies": false, "sup_bw": 0.0, "source": "no_hint", "clamped": false}) {
		t.Fatalf("effective: %v", eff)
	}
	rails := map[float64]map[string]any{} // slot index -> the rail-state fields of its telemetry
	for _, c := range listed {
		tel, _ := c["telemetry"].(map[string]any)
		r := map[string]any{}
		for _, k := range []string{"sout_state", "sup_state", "failovers", "sout_state_ns", "sup_state_ns"} {
			r[k] = tel[k]
		}
		idx, _ := c["index"].(float64)
		rails[idx] = r
	}
	wantRails := map[float64]map[string]any{
		float64(f.a): {"sout_state": "up", "sup_state": "down", "failovers": 1.0, "sout_state_ns": 0.0, "sup_state_ns": 1763856000123456789.0},
		float64(f.b): {"sout_state": "failed", "sup_state": "unknown(9)", "failovers": 2.0, "sout_state_ns": 1763856001000000000.0, "sup_state_ns": 7.0},
	}
	for _, want := range []string{"\"applied_sup_bw\": 300,", "\"flush_wall_ns\": 1763856000999999999,", "\"sout_completed_bytes\": 1099511627776,",
		"\"sout_busy_ns\": 9223372036854775809,", "\"sout_inflight_bytes\": 77,", "\"sup_inflight_bytes\": 18446744073709551615,"} {
		if !strings.Contains(gOut, want) { // exact, not as a float64
			t.Fatalf("list --json lacks %s:\n%s", want, gOut)
		}
	}
	if !strings.Contains(gOut, "\"sup_state_ns\": 1763856000123456789,") { // exact, not as a float64
		t.Fatalf("list --json: sup_state_ns of slot %d is not exact:\n%s", f.a, gOut)
	}
	for idx, w := range wantRails {
		if !reflect.DeepEqual(rails[idx], w) {
			t.Fatalf("list --json: slot %v rail states: expected %v but got %v", idx, w, rails[idx])
		}
	}
	gOut, _, _ = goCLI.run(t, env, "list", "--path", f.path)
	pOut, _, _ = pyCLI.run(t, env, "list", "--path", f.path)
	if normalize(gOut) != normalize(pOut) || !strings.Contains(gOut, " inter ") ||
		!strings.Contains(gOut, " up/down ") || !strings.Contains(gOut, " failed/unknown(9) ") ||
		!strings.Contains(gOut, "\ndefaults: class inter=300\n") { // the class table itself, set above
		t.Fatalf("list differs:\n--- go\n%s--- python\n%s", gOut, pOut)
	}
	peerNet, _ := shm.ParseIPv4("10.0.2.0")
	f.seg.SetPeerHint(peerNet, 24, 512, true)
	gOut, _, _ = goCLI.run(t, env, "list", "--path", f.path)
	pOut, _, _ = pyCLI.run(t, env, "list", "--path", f.path)
	if normalize(gOut) != normalize(pOut) || !strings.Contains(gOut, "\ndefaults: class inter=300 peer 10.0.2.0/24=512\n") {
		t.Fatalf("list differs:\n--- go\n%s--- python\n%s", gOut, pOut)
	}
	emptyPath := filepath.Join(dir, "empty")
	if s, err := shm.Create(emptyPath, 2, 0, false); err == nil {
		s.Close()
	}
	if g, _, _ := goCLI.run(t, env, "list", "--json", "--path", emptyPath); g != "[]\n" {
		t.Fatalf("an empty list must print []: %q", g)
	}

	weights := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	goodW := weights("good.json", `{"class":{"intra":1024,"Inter":0},"peers":{"10.0.2.0/24":512,"10.0.1.5":5000},"conns":{"4242:1":700,"7":9}}`)
	fracW := weights("frac.json", `{"class":{"intra":512.5}}`)
	boolW := weights("bool.json", `{"class":{"intra":true}}`)
	dupW := weights("dup.json", `{"class":{"intra":1,"intra":2}}`)
	negZeroW := weights("negzero.json", `{"class":{"intra":-0}}`)
	aliasW := weights("alias.json", `{"class":{"0":700,"intra":5},"peers":{"10.0.2.7":900,"10.0.2.7/32":100}}`)
	peerAliasW := weights("peer-alias.json", `{"peers":{"10.0.2.7":900,"10.0.2.7/32":100}}`)
	badBin := filepath.Join(dir, "bad.bin")
	os.WriteFile(badBin, bytes.Repeat([]byte("garbage!"), 100), 0o600)
	v1 := filepath.Join(dir, "v1.bin")
	if img, err := os.ReadFile("../../../../testdata/shm/bad_version.bin"); err == nil {
		os.WriteFile(v1, img, 0o600)
	}

	type tcase struct {
		name string
		args []string // --path SEG is appended unless the case names one
		exit int
		code string
		long bool // a loop: runs until its output settles, then SIGTERM
		// steps run one after the other while the loop runs, each once its output settled
		steps  []func(t *testing.T, fx *fixture, weights string)
		weight string // initial content of the weights file the argument "W" names
		stderr string // a substring both CLIs' stderr must hold
	}
	cases := []tcase{
		{name: "set conn", args: []string{"set", "--conn", "A", "--sup-bw", "512"}},
		{name: "set conn by pid:conn", args: []string{"set", "--conn", "4242:2", "--sup-bw", "700"}},
		{name: "set conn with its gen", args: []string{"set", "--conn", "A", "--gen", "2", "--sup-bw", "64"}},
		{name: "set conn, stale gen", args: []string{"set", "--conn", "A", "--gen", "1", "--sup-bw", "64"}, exit: 1, code: "gen_changed"},
		{name: "set conn, clear", args: []string{"set", "--conn", "A", "--clear"}},
		{name: "set conn, no connection", args: []string{"set", "--conn", "4242:99", "--sup-bw", "1"}, exit: 1, code: "slot_inactive"},
		{name: "set peer island", args: []string{"set", "--peer", "10.0.2.0/24", "--sup-bw", "256"}},
		{name: "set peer island by a host", args: []string{"set", "--peer", "10.0.2.7/24", "--sup-bw", "100"}},
		{name: "set peer", args: []string{"set", "--peer", "10.0.2.7", "--sup-bw", "0"}},
		{name: "set peer, clear absent", args: []string{"set", "--peer", "10.9.9.9", "--clear"}},
		{name: "set class clamped", args: []string{"set", "--class", "inter", "--sup-bw", "99999999999"}},
		{name: "set class 0", args: []string{"set", "--class", "0", "--sup-bw", "3"}},
		{name: "set class, bad", args: []string{"set", "--class", "outer", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "set, no target", args: []string{"set", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "set, two targets", args: []string{"set", "--conn", "A", "--class", "intra", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "set, both value and clear", args: []string{"set", "--class", "intra", "--sup-bw", "1", "--clear"}, exit: 2, code: "usage"},
		{name: "set, negative", args: []string{"set", "--class", "intra", "--sup-bw", "-5"}, exit: 2, code: "usage"},
		{name: "set, fraction", args: []string{"set", "--class", "intra", "--sup-bw", "1.5"}, exit: 2, code: "usage"},
		{name: "set, bad conn", args: []string{"set", "--conn", "+3", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "set, bad peer", args: []string{"set", "--peer", "10.0.2.0/33", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "set, gen without conn", args: []string{"set", "--class", "intra", "--gen", "1", "--sup-bw", "1"}, exit: 2, code: "usage"},
		{name: "list, unknown flag", args: []string{"list", "--bogus"}, exit: 2, code: "usage"},
		{name: "list, stray argument", args: []string{"list", "extra"}, exit: 2, code: "usage"},
		{name: "list, no file", args: []string{"list", "--path", filepath.Join(dir, "missing")}, exit: 1, code: "io"},
		{name: "list, garbage", args: []string{"list", "--path", badBin}, exit: 1, code: "bad_magic"},
		{name: "list, format v1", args: []string{"list", "--path", v1}, exit: 1, code: "bad_version"},
		{name: "top, zero interval", args: []string{"top", "--interval", "0"}, exit: 2, code: "usage"},
		{name: "top, bad interval", args: []string{"top", "--interval", "10xs"}, exit: 2, code: "usage"},
		{name: "top, negative count", args: []string{"top", "--count", "-1"}, exit: 2, code: "usage"},
		{name: "create over a live segment", args: []string{"create"}, exit: 1, code: "segment_live"},
		{name: "create, bad geometry", args: []string{"create", "--path", filepath.Join(dir, "x"), "--slots", "0"}, exit: 1, code: "bad_geometry"},
		{name: "create, negative peers", args: []string{"create", "--path", filepath.Join(dir, "x"), "--peers", "-1"}, exit: 1, code: "bad_geometry"},
		{name: "create, not a number", args: []string{"create", "--path", filepath.Join(dir, "x"), "--slots", "1e3"}, exit: 2, code: "usage"},
		{name: "run, unknown policy", args: []string{"run", "--policy", "bogus"}, exit: 2, code: "usage"},
		{name: "run static, no file", args: []string{"run", "--policy", "static"}, exit: 2, code: "usage"},
		{name: "run, bad capacity", args: []string{"run", "--policy", "proportional", "--capacity", "sout=x"}, exit: 2, code: "usage"},
		{name: "run, unknown rail", args: []string{"run", "--policy", "proportional", "--capacity", "foo=1"}, exit: 2, code: "usage"},
		{name: "run, rail twice", args: []string{"run", "--policy", "proportional", "--capacity", "sout=1,sout=2"}, exit: 2, code: "usage"},
		{name: "run, SOUT capacity alone", args: []string{"run", "--policy", "proportional", "--capacity", "sout=100"}, exit: 2, code: "usage",
			stderr: "sup\" missing: give both"},
		{name: "run, SUP capacity alone", args: []string{"run", "--policy", "proportional", "--capacity", "sup=100"}, exit: 2, code: "usage",
			stderr: "sout\" missing: give both"},
		{name: "run, capacity beyond float64", args: []string{"run", "--policy", "proportional", "--capacity", "sout=1" + strings.Repeat("0", 400) + ",sup=1"},
			exit: 2, code: "usage"},
		{name: "run, bad interval", args: []string{"run", "--policy", "proportional", "--interval", "-1s"}, exit: 2, code: "usage"},
		{name: "run static, missing file", args: []string{"run", "--policy", "static", "--file", filepath.Join(dir, "none.json")}, exit: 1, code: "bad_weights"},
		{name: "run static, fractional weight", args: []string{"run", "--policy", "static", "--file", fracW}, exit: 1, code: "bad_weights"},
		{name: "run static, boolean weight", args: []string{"run", "--policy", "static", "--file", boolW}, exit: 1, code: "bad_weights"},
		{name: "run static, weight -0", args: []string{"run", "--policy", "static", "--file", negZeroW}, exit: 1, code: "bad_weights",
			stderr: "sup_bw -0: want an integer 0..1024"},
		{name: "run static, duplicate key", args: []string{"run", "--policy", "static", "--file", dupW}, exit: 1, code: "bad_weights",
			stderr: `duplicate key "intra"`},
		{name: "run static, class aliases", args: []string{"run", "--policy", "static", "--file", aliasW}, exit: 1, code: "bad_weights",
			stderr: `class "0" and "intra" name the same target`},
		{name: "run static, peer aliases", args: []string{"run", "--policy", "static", "--file", peerAliasW}, exit: 1, code: "bad_weights",
			stderr: `peers "10.0.2.7" and "10.0.2.7/32" name the same target`},
		{name: "run static", args: []string{"run", "--policy", "static", "--file", goodW, "--interval", "50ms"}, long: true},
		{name: "run proportional", args: []string{"run", "--policy", "proportional", "--capacity", "sout=1,sup=3", "--interval", "0.05"}, long: true},
		{name: "run static, file edited while running", long: true,
			args:   []string{"run", "--policy", "static", "--file", "W", "--interval", "50ms"},
			weight: `{"class":{"inter":100},"peers":{"10.0.2.0/24":512},"conns":{"4242:9":300,"4242:2":50}}`,
			stderr: "keeping the last good weights",
			steps: []func(t *testing.T, fx *fixture, w string){
				func(t *testing.T, fx *fixture, w string) { writeAt(t, w, `{"class":{"inter":100},"peers":{`, 2) },
				func(t *testing.T, fx *fixture, w string) {
					writeAt(t, w, `{"class":{"inter":100},"conns":{"4242:9":300}}`, 3) // peer and 4242:2 deleted
				},
				func(t *testing.T, fx *fixture, w string) { // 4242:9 connects now
					ip, _ := shm.ParseIPv4("10.0.2.9")
					fx.plug.Register(emulate.ConnDesc{PeerSoutIP: ip, PathClass: shm.InterIsland, IsSend: true, PID: 4242, ConnID: 9})
				},
			}},
		{name: "gc", args: []string{"gc"}},
		{name: "run closed-loop, step 0", args: []string{"run", "--policy", "closed-loop", "--step", "0"}, exit: 2, code: "usage"},
		{name: "run closed-loop, step 257", args: []string{"run", "--policy", "closed-loop", "--step", "257"}, exit: 2, code: "usage"},
		{name: "run closed-loop, negative step", args: []string{"run", "--policy", "closed-loop", "--step", "-8"}, exit: 2, code: "usage"},
		{name: "run closed-loop, fractional step", args: []string{"run", "--policy", "closed-loop", "--step", "1.5"}, exit: 2, code: "usage"},
		{name: "run closed-loop, step not a number", args: []string{"run", "--policy", "closed-loop", "--step", "x"}, exit: 2, code: "usage"},
		{name: "run closed-loop, empty step", args: []string{"run", "--policy", "closed-loop", "--step", ""}, exit: 2, code: "usage"},
		{name: "run closed-loop, bad interval", args: []string{"run", "--policy", "closed-loop", "--interval", "0"}, exit: 2, code: "usage"},
		{name: "run closed-loop, no segment", args: []string{"run", "--policy", "closed-loop", "--step", "256", "--path", filepath.Join(dir, "missing")}, exit: 1, code: "io"},
		{name: "record, no --out", args: []string{"record", "--count", "1"}, exit: 2, code: "usage"},
		{name: "record, bad format", args: []string{"record", "--out", filepath.Join(dir, "r.xml"), "--format", "xml"}, exit: 2, code: "usage"},
		{name: "record, negative count", args: []string{"record", "--out", filepath.Join(dir, "r.csv"), "--count", "-1"}, exit: 2, code: "usage"},
		{name: "record, zero interval", args: []string{"record", "--out", filepath.Join(dir, "r.csv"), "--interval", "0"}, exit: 2, code: "usage"},
		{name: "record, no file", args: []string{"record", "--out", filepath.Join(dir, "r.csv"), "--count", "1", "--path", filepath.Join(dir, "missing")}, exit: 1, code: "io"},
		{name: "top --json, bad count", args: []string{"top", "--json", "--count", "x"}, exit: 2, code: "usage"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.long {
				t.Parallel() // loops stay serial: they wait for their output to settle
			}
			var outs [2]outcome
			var paths []string
			for j, c := range []cli{goCLI, pyCLI} {
				fx := newFixture(t, dir, fmt.Sprintf("case%d-%s", i, c.name))
				paths = append(paths, fx.path)
				if tc.name == "gc" { // a connection whose process died
					dead, _ := emulate.Attach(fx.path)
					dead.Register(emulate.ConnDesc{PID: 999999, ConnID: 77})
					dead.Close()
				}
				args := make([]string, 0, len(tc.args)+2)
				hasPath := false
				w := filepath.Join(dir, fmt.Sprintf("case%d-%s.json", i, c.name))
				writeAt(t, w, tc.weight, 1)
				for _, a := range tc.args {
					hasPath = hasPath || a == "--path"
					switch a {
					case "A":
						a = fmt.Sprint(fx.a)
					case "W":
						a = w
					}
					args = append(args, a)
				}
				if !hasPath {
					args = append(args, "--path", fx.path)
				}
				var o, e string
				var code int
				if tc.long {
					o, e, code = runLoop(t, c, env, fx, args, func(k int) {
						tc.steps[k](t, fx, w)
					}, len(tc.steps))
				} else {
					o, e, code = c.run(t, env, args...)
				}
				outs[j] = outcome{stdout: o, code: errCodeOf(e), exit: code, state: fx.state(t)}
				if !strings.Contains(e, tc.stderr) {
					t.Errorf("%s: stderr lacks %q:\n%s", c.name, tc.stderr, e)
				}
				if code != tc.exit || outs[j].code != tc.code {
					t.Errorf("%s: expected exit %d code %q but got exit %d code %q\nstdout: %s\nstderr: %s",
						c.name, tc.exit, tc.code, code, outs[j].code, o, e)
				}
			}
			g, p := outs[0], outs[1]
			g.stdout, p.stdout = normalize(g.stdout, paths...), normalize(p.stdout, paths...)
			t.Logf("exit %d code %q stdout:\n%s", g.exit, g.code, g.stdout)
			if g.stdout != p.stdout {
				t.Errorf("stdout differs:\n--- go\n%s--- python\n%s", g.stdout, p.stdout)
			}
			if g.state != p.state {
				t.Errorf("resulting segment differs:\n--- go\n%s\n--- python\n%s", g.state, p.state)
			}
		})
	}
}

// writeAt writes a weights file with an mtime of its own (n seconds after the epoch), so that
// every edit is seen whatever the file system's timestamp granularity.
// writeAt replaces path with body stamped at mtime n in one rename: written in place, a
// loop polling between the write and the Chtimes saw two changes and loaded the file twice
// (a fresh-clone run failed on that extra line).
func writeAt(t *testing.T, path, body string, n int64) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	when := time.Unix(n, 0)
	if err := os.Chtimes(tmp, when, when); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// runLoop starts a policy loop; each time its output has been quiet for 400 ms it runs the
// next step, and after the last one it stops the loop with SIGTERM.
func runLoop(t *testing.T, c cli, env []string, fx *fixture, args []string, step func(int), nsteps int) (string, string, int) {
	t.Helper()
	cmd := c.command(env, args...)
	stdout, _ := cmd.StdoutPipe()
	var e bytes.Buffer
	cmd.Stderr = &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var o bytes.Buffer
	last := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			mu.Lock()
			o.WriteString(sc.Text() + "\n")
			last = time.Now()
			mu.Unlock()
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for k := 0; ; {
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		quiet := time.Since(last) > 400*time.Millisecond && o.Len() > 0
		mu.Unlock()
		exited := false
		select {
		case <-done: // the loop exited on its own (refused its command line, failed)
			exited = true
		default:
		}
		if exited || time.Now().After(deadline) || (quiet && k == nsteps) {
			break
		}
		if quiet {
			step(k)
			k++
			mu.Lock()
			last = time.Now()
			mu.Unlock()
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a loop that ignores or deadlocks on SIGTERM
		t.Errorf("%s: the loop did not exit within 10 s of SIGTERM", c.name)
		cmd.Process.Kill()
		<-done
	}
	err := cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	}
	if fx.seg.Header().HeartbeatNs != 0 {
		t.Errorf("%s: the loop did not clear its heartbeat on SIGTERM", c.name)
	}
	mu.Lock()
	defer mu.Unlock()
	return o.String(), e.String(), code
}

// sampleFixed are the fields of a top --json / record connection that do not depend on when
// it was sampled.
var sampleFixed = []string{"slot", "gen", "pid", "conn_id", "is_send", "path_class", "last_sup_bw", "sout_state", "sup_state",
	"sout_inflight_bytes", "sup_inflight_bytes", "applied_sup_bw", "flush_wall_ns", "dev", "sout_nic", "sup_nic"}

// sampleShape is a top --json / record jsonl line reduced to what both CLIs must agree on:
// the keys in order, the JSON type of every value, and the values that do not depend on
// time; it fails the test when the line is not {"t": number, "conns": [...]}.
func sampleShape(t *testing.T, who, line string) string {
	t.Helper()
	if k := jsonKeys(t, []byte(line)); !reflect.DeepEqual(k, []string{"t", "conns"}) {
		t.Errorf("%s: top-level keys %v, want [t conns]: %s", who, k, line)
	}
	var smp struct {
		T     any               `json:"t"`
		Conns []json.RawMessage `json:"conns"`
	}
	if err := json.Unmarshal([]byte(line), &smp); err != nil {
		t.Errorf("%s: %v: %s", who, err, line)
		return ""
	}
	if _, ok := smp.T.(float64); !ok {
		t.Errorf("%s: t is not a number: %s", who, line)
	}
	var shape []string
	for _, raw := range smp.Conns {
		keys := jsonKeys(t, raw)
		if !reflect.DeepEqual(keys, topKeys) {
			t.Errorf("%s: connection keys %v, want %v", who, keys, topKeys)
		}
		var c map[string]any
		json.Unmarshal(raw, &c)
		parts := []string{}
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s:%T", k, c[k]))
		}
		for _, k := range sampleFixed {
			parts = append(parts, fmt.Sprintf("%s=%v", k, c[k]))
		}
		shape = append(shape, strings.Join(parts, " "))
	}
	return strings.Join(shape, "\n")
}

// jsonKeys returns an object's keys in the order they appear.
func jsonKeys(t *testing.T, raw []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Errorf("not a JSON object: %s", raw)
		return nil
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Errorf("%v: %s", err, raw)
			return keys
		}
		keys = append(keys, fmt.Sprint(k))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Errorf("%v: %s", err, raw)
			return keys
		}
	}
	return keys
}

// TestCLIsAgreeSamples runs `top --json --count 1` and `record --format jsonl|csv` of both
// CLIs on one segment (connections with telemetry and rail states) and requires the same
// structure: keys and their order, value types, row and column counts, and the same values
// for every field that does not depend on the sampling time (rates may differ).
func TestCLIsAgreeSamples(t *testing.T) {
	goCLI := cli{"go", []string{agentBin(t)}, nil}
	pyCLI := pythonCLI(t)
	dir := t.TempDir()
	env := []string{cliEnvStale}
	f := newFixture(t, dir, "sampled")
	f.plug.SetRailState(f.a, 1, shm.RailDown, 1_763_856_000_123_456_789)
	f.plug.RecordRead(f.a, shm.Resolution{Applies: true, SupBw: 700, Source: shm.SourceSlot}, shm.Now())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // traffic on a's SOUT and b's both rails while the CLIs sample
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
				f.plug.AddTelemetryN(f.a, 0, 1<<20, 1)
				f.plug.FlushTelemetry(f.b, emulate.TelemetryBatch{AppliedSupBw: 512, WallNs: 1_763_856_000_000_000_007,
					Rails: [2]emulate.RailBatch{
						{PostedBytes: 1 << 19, PostedRequests: 1, CompletedBytes: 1 << 19, CompletedRequests: 1, BusyNs: 90_000, InflightBytes: 1 << 19},
						{PostedBytes: 1 << 19, PostedRequests: 1, CompletedBytes: 1 << 19, CompletedRequests: 1, BusyNs: 70_000, InflightBytes: 3}}})
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	type result struct{ top, jsonl, csvHead, csvShape string }
	var res [2]result
	for j, c := range []cli{goCLI, pyCLI} {
		r := &res[j]
		o, e, code := c.run(t, env, "top", "--json", "--count", "1", "--interval", "200ms", "--path", f.path)
		lines := strings.Split(strings.TrimRight(o, "\n"), "\n")
		if code != 0 || len(lines) != 1 {
			t.Errorf("%s top --json --count 1: exit %d, want one line:\n%s\nstderr: %s", c.name, code, o, e)
		} else {
			r.top = sampleShape(t, c.name+" top --json", lines[0])
		}
		jl := filepath.Join(dir, c.name+".jsonl")
		_, e, code = c.run(t, env, "record", "--out", jl, "--format", "jsonl", "--count", "2", "--interval", "0.1", "--path", f.path)
		b, _ := os.ReadFile(jl)
		lines = strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if code != 0 || len(lines) != 2 {
			t.Errorf("%s record --format jsonl --count 2: exit %d, want 2 lines:\n%s\nstderr: %s", c.name, code, b, e)
		} else {
			r.jsonl = sampleShape(t, c.name+" record jsonl", lines[0]) + "\n" + sampleShape(t, c.name+" record jsonl", lines[1])
		}
		cf := filepath.Join(dir, c.name+".csv")
		_, e, code = c.run(t, env, "record", "--out", cf, "--format", "csv", "--count", "1", "--interval", "100ms", "--path", f.path)
		fh, err := os.Open(cf)
		if err != nil {
			t.Errorf("%s record --format csv: exit %d, %v\nstderr: %s", c.name, code, err, e)
			continue
		}
		rows, err := csv.NewReader(fh).ReadAll()
		fh.Close()
		if code != 0 || err != nil || len(rows) != 4 { // header + three connections
			t.Errorf("%s record --format csv --count 1: exit %d, %v, want a header and 3 rows: %q\nstderr: %s", c.name, code, err, rows, e)
			continue
		}
		r.csvHead = strings.Join(rows[0], ",")
		if want := strings.Join(append([]string{"t"}, topKeys...), ","); r.csvHead != want {
			t.Errorf("%s record csv header %q, want %q", c.name, r.csvHead, want)
		}
		var shape []string
		for _, row := range rows[1:] {
			if len(row) != len(rows[0]) {
				t.Errorf("%s record csv: row %q has %d columns, header %d", c.name, row, len(row), len(rows[0]))
				continue
			}
			for k, col := range rows[0] {
				switch col {
				case "t", "sout_mbps", "sup_mbps", "sout_completed_mbps", "sup_completed_mbps", "sout_latency_us", "sup_latency_us":
					if _, err := strconv.ParseFloat(row[k], 64); err != nil {
						t.Errorf("%s record csv: %s %q is not a number", c.name, col, row[k])
					}
				default:
					shape = append(shape, col+"="+row[k])
				}
			}
		}
		r.csvShape = strings.Join(shape, " ")
	}
	if res[0].top != res[1].top {
		t.Errorf("top --json differs:\n--- go\n%s\n--- python\n%s", res[0].top, res[1].top)
	}
	if res[0].jsonl != res[1].jsonl {
		t.Errorf("record jsonl differs:\n--- go\n%s\n--- python\n%s", res[0].jsonl, res[1].jsonl)
	}
	if res[0].csvHead != res[1].csvHead || res[0].csvShape != res[1].csvShape {
		t.Errorf("record csv differs:\n--- go\n%s\n%s\n--- python\n%s\n%s", res[0].csvHead, res[0].csvShape, res[1].csvHead, res[1].csvShape)
	}
	if !strings.Contains(res[0].top, "sup_state=down") || !strings.Contains(res[0].top, "last_sup_bw=700") ||
		!strings.Contains(res[0].top, "applied_sup_bw=512 flush_wall_ns=") ||
		!strings.Contains(res[0].top, "sup_inflight_bytes=3") {
		t.Errorf("go top --json lacks the fixture's rail state, last_sup_bw or completion gauges:\n%s", res[0].top)
	}
}

// TestCLIsAgreeClosedLoop runs `run --policy closed-loop` of both CLIs on copies of one
// segment whose connections move no bytes: each starts every send connection at sup_bw 512
// (for the slot's gen) and writes nothing else; both must leave the same segment.
func TestCLIsAgreeClosedLoop(t *testing.T) {
	goCLI := cli{"go", []string{agentBin(t)}, nil}
	pyCLI := pythonCLI(t)
	dir := t.TempDir()
	env := []string{cliEnvStale}
	var states [2]string
	for j, c := range []cli{goCLI, pyCLI} {
		fx := newFixture(t, dir, "closed-"+c.name)
		_, e, code := runLoop(t, c, env, fx, []string{"run", "--policy", "closed-loop", "--step", "32", "--interval", "50ms", "--path", fx.path}, nil, 0)
		if code != 0 {
			t.Errorf("%s run --policy closed-loop: exit %d\nstderr: %s", c.name, code, e)
		}
		for _, s := range []uint32{fx.a, fx.b} {
			sl, _ := fx.seg.Slot(s)
			if !sl.Hint.Valid() || sl.Hint.SupBw != 512 || sl.Hint.Gen != sl.Gen {
				t.Errorf("%s run --policy closed-loop: slot %d hint %+v, want sup_bw 512 for gen %d", c.name, s, sl.Hint, sl.Gen)
			}
		}
		states[j] = fx.state(t)
	}
	if states[0] != states[1] {
		t.Errorf("resulting segment differs:\n--- go\n%s\n--- python\n%s", states[0], states[1])
	}
}
