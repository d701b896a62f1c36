package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
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
	a, b uint32 // a: inter-island send, registered twice (gen 2); b: intra-island send
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
	f.seg = seg
	reg := func(conn uint64, peer string, class shm.PathClass, send bool) uint32 {
		ip, _ := shm.ParseIPv4(peer)
		local, _ := shm.ParseIPv4("10.0.1.1")
		s, err := seg.Register(shm.ConnDesc{LocalSoutIP: local, PeerSoutIP: ip, PeerIsland: ip & 0xFFFFFF00,
			PathClass: class, IsSend: send, NQPsSout: 1, NQPsSup: 2, PID: 4242, ConnID: conn})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	f.a = reg(1, "10.0.2.7", shm.InterIsland, true)
	seg.Release(f.a)
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
	f.seg.AddTelemetry(f.a, 1, 12345)
	f.seg.SetRailState(f.a, 1, shm.RailDown, 1_763_856_000_123_456_789) // SUP failed over
	f.seg.SetRailState(f.b, 0, shm.RailFailed, 1_763_856_001_000_000_000)
	f.seg.SetRailState(f.b, 1, shm.RailState(9), 7) // a state this agent does not know
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
	if !strings.Contains(gOut, "\"sup_state_ns\": 1763856000123456789\n") { // exact, not as a float64
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
		!strings.Contains(gOut, " up/down ") || !strings.Contains(gOut, " failed/unknown(9) ") {
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
		{name: "run, bad interval", args: []string{"run", "--policy", "proportional", "--interval", "-1s"}, exit: 2, code: "usage"},
		{name: "run static, missing file", args: []string{"run", "--policy", "static", "--file", filepath.Join(dir, "none.json")}, exit: 1, code: "bad_weights"},
		{name: "run static, fractional weight", args: []string{"run", "--policy", "static", "--file", fracW}, exit: 1, code: "bad_weights"},
		{name: "run static, boolean weight", args: []string{"run", "--policy", "static", "--file", boolW}, exit: 1, code: "bad_weights"},
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
					fx.seg.Register(shm.ConnDesc{PeerSoutIP: ip, PathClass: shm.InterIsland, IsSend: true, PID: 4242, ConnID: 9})
				},
			}},
		{name: "gc", args: []string{"gc"}},
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
					dead, _ := shm.Open(fx.path)
					dead.Register(shm.ConnDesc{PID: 999999, ConnID: 77})
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
func writeAt(t *testing.T, path, body string, n int64) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	when := time.Unix(n, 0)
	os.Chtimes(path, when, when)
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
		if time.Now().After(deadline) || (quiet && k == nsteps) {
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
	<-done
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
