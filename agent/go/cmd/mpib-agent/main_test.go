package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
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
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

func run(t *testing.T, f func([]string, *bytes.Buffer) error, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	if err := f(args, &out); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String()
}

func TestCommands(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hints")
	create := func(a []string, b *bytes.Buffer) error { return cmdCreate(a, b) }
	set := func(a []string, b *bytes.Buffer) error { return cmdSet(a, b) }
	list := func(a []string, b *bytes.Buffer) error { return cmdList(a, b) }
	top := func(a []string, b *bytes.Buffer) error { return cmdTop(a, b) }
	run(t, create, "--path", path, "--slots", "8", "--peers", "4")
	seg, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	plug := attachPlugin(t, path)
	ip, _ := shm.ParseIPv4("10.0.2.7")
	slot, err := plug.Register(emulate.ConnDesc{PeerSoutIP: ip, PathClass: shm.InterIsland, IsSend: true, NQPsSout: 2, NQPsSup: 4, PID: uint32(os.Getpid()), ConnID: 9})
	if err != nil {
		t.Fatal(err)
	}
	seg.Beat(shm.Now())
	if err := cmdCreate([]string{"--path", path}, &bytes.Buffer{}); errCode(err) != "segment_live" {
		t.Fatalf("create over a live segment without --force: %v", err)
	}
	if got := run(t, set, "--path", path, "--conn", fmt.Sprint(slot), "--sup-bw", "512"); !strings.Contains(got, "sup_bw=512") {
		t.Fatalf("set: %q", got)
	}
	if r := seg.Resolve(slot, shm.Now(), 1e9); r.SupBw != 512 || r.Source != shm.SourceSlot {
		t.Fatalf("after set --conn: %+v", r)
	}
	run(t, set, "--path", path, "--conn", fmt.Sprintf("%d:9", os.Getpid()), "--clear")
	run(t, set, "--path", path, "--peer", "10.0.2.0/24", "--sup-bw", "256")
	if r := seg.Resolve(slot, shm.Now(), 1e9); r.SupBw != 256 || r.Source != shm.SourcePeer {
		t.Fatalf("after set --peer: %+v", r)
	}
	if got := run(t, set, "--path", path, "--class", "inter", "--sup-bw", "9999"); !strings.Contains(got, "sup_bw=1024") {
		t.Fatalf("clamped set: %q", got)
	}
	// A slot no connection holds (registration picks slots by pid, so derive it).
	unused := fmt.Sprint((slot + 1) % 8)
	for _, bad := range []struct {
		args []string
		code string
	}{
		{[]string{"--conn", "0"}, "usage"},
		{[]string{"--sup-bw", "1"}, "usage"},
		{[]string{"--conn", unused, "--sup-bw", "1"}, "slot_inactive"},
		{[]string{"--conn", fmt.Sprint(slot), "--gen", "77", "--sup-bw", "1"}, "gen_changed"},
		{[]string{"--class", "outer", "--sup-bw", "1"}, "usage"},
	} {
		if err := cmdSet(append([]string{"--path", path}, bad.args...), &bytes.Buffer{}); errCode(err) != bad.code {
			t.Errorf("set %v: expected %s but got %v", bad.args, bad.code, err)
		}
	}
	if got := run(t, list, "--path", path); !strings.Contains(got, "10.0.2.7") || !strings.Contains(got, "peer") {
		t.Fatalf("list: %q", got)
	}
	if got := run(t, list, "--path", path, "--json"); !strings.Contains(got, `"source": "peer"`) {
		t.Fatalf("list --json: %q", got)
	}
	plug.AddTelemetry(slot, 1, 1<<20)
	if got := run(t, top, "--path", path, "--count", "1", "--interval", "50ms", "--plain"); !strings.Contains(got, "SUP Gb/s") {
		t.Fatalf("top: %q", got)
	}
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// agentBin builds the mpib-agent binary once per test run.
func agentBin(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "mpib-agent-bin")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "mpib-agent")
		build := exec.Command("go", "build", "-o", binPath, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// TestKillGoesStale: a running agent keeps the heartbeat fresh; SIGKILL makes it stale
// within MPIB_AGENT_STALE_MS; a clean SIGTERM clears it at once.
func TestKillGoesStale(t *testing.T) {
	bin := agentBin(t)
	path := filepath.Join(t.TempDir(), "hints")
	if out, err := exec.Command(bin, "create", "--path", path, "--slots", "4", "--peers", "0").CombinedOutput(); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	seg, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	const stale = 500 * time.Millisecond
	fresh := func() bool { return shm.HeartbeatFresh(seg.Header().HeartbeatNs, shm.Now(), uint64(stale)) }
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		agent := exec.Command(bin, "heartbeat", "--path", path)
		if err := agent.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for !fresh() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		if !fresh() {
			t.Fatalf("heartbeat not fresh while the agent runs")
		}
		agent.Process.Signal(sig)
		agent.Wait()
		if sig == syscall.SIGTERM && seg.Header().HeartbeatNs != 0 {
			t.Fatal("SIGTERM: heartbeat not cleared")
		}
		time.Sleep(stale + 100*time.Millisecond)
		if fresh() {
			t.Fatalf("%v: heartbeat still fresh after %v", sig, stale)
		}
	}
}

// Defect 6 (CLI): a second beating agent is refused, whichever language; the first keeps
// beating; the beat period follows MPIB_AGENT_STALE_MS.
func TestSecondAgentRefused(t *testing.T) {
	bin := agentBin(t)
	py := pythonCLI(t)
	path := filepath.Join(t.TempDir(), "hints")
	if out, err := exec.Command(bin, "create", "--path", path, "--slots", "4", "--peers", "0").CombinedOutput(); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	first := exec.Command(bin, "heartbeat", "--path", path)
	first.Env = append(os.Environ(), "MPIB_AGENT_STALE_MS=200")
	var firstOut bytes.Buffer
	first.Stdout = &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer first.Process.Kill()
	seg, _ := shm.Open(path)
	defer seg.Close()
	deadline := time.Now().Add(5 * time.Second)
	for seg.Header().HeartbeatNs == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []cli{{"go", []string{bin}, nil}, py} {
		for _, args := range [][]string{{"heartbeat"}, {"run", "--policy", "proportional"}} {
			out, errOut, code := c.run(t, nil, append(args, "--path", path)...)
			if code != 1 || errCodeOf(errOut) != "agent_running" {
				t.Errorf("%s %v: expected exit 1 agent_running but got %d %q %q", c.name, args, code, out, errOut)
			}
		}
	}
	// The first agent beats every 200/4 = 50 ms (not a fixed 100 ms): ~20 beats a second.
	beats := map[uint64]bool{}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
		beats[seg.Header().HeartbeatNs] = true
	}
	first.Process.Signal(syscall.SIGTERM)
	first.Wait()
	if len(beats) < 15 || !strings.Contains(firstOut.String(), "every 50 ms") {
		t.Fatalf("MPIB_AGENT_STALE_MS=200: %d beats in a second, want ~20 (%q)", len(beats), firstOut.String())
	}
	if seg.Header().HeartbeatNs != 0 {
		t.Fatal("SIGTERM: heartbeat not cleared")
	}
}

// topKeys is the order of a top --json connection's fields.
var topKeys = []string{"slot", "gen", "pid", "conn_id", "is_send", "path_class", "sout_mbps", "sup_mbps",
	"last_sup_bw", "sout_state", "sup_state", "sout_completed_mbps", "sup_completed_mbps", "sout_latency_us", "sup_latency_us",
	"sout_inflight_bytes", "sup_inflight_bytes", "applied_sup_bw", "flush_wall_ns", "dev", "sout_nic", "sup_nic"}

func TestTopJSONAndRecord(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hints")
	seg, err := shm.Create(path, 8, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	plug := attachPlugin(t, path)
	ip, _ := shm.ParseIPv4("10.0.2.7")
	slot, err := plug.Register(emulate.ConnDesc{PeerSoutIP: ip, PathClass: shm.InterIsland, IsSend: true, PID: 77, ConnID: 5})
	if err != nil {
		t.Fatal(err)
	}
	plug.SetRailState(slot, 1, shm.RailDown, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // traffic on SOUT
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				plug.FlushTelemetry(slot, emulate.TelemetryBatch{AppliedSupBw: 0, WallNs: 1_763_856_000_000_000_001,
					Rails: [2]emulate.RailBatch{{PostedBytes: 1 << 20, PostedRequests: 4, CompletedBytes: 1 << 20,
						CompletedRequests: 4, BusyNs: 4 * 250_000, InflightBytes: 1 << 18}}})
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	var out bytes.Buffer
	if err := cmdTop([]string{"--path", path, "--json", "--count", "2", "--interval", "50ms"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("top --json --count 2: want 2 lines, got %q", out.String())
	}
	var smp struct {
		T     float64          `json:"t"`
		Conns []map[string]any `json:"conns"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &smp); err != nil || len(smp.Conns) != 1 {
		t.Fatalf("top --json: %v %s", err, lines[1])
	}
	if k := jsonKeys(t, []byte(lines[1])); !reflect.DeepEqual(k, []string{"t", "conns"}) {
		t.Fatalf("top --json keys: %v", k)
	}
	if math.Abs(smp.T-float64(time.Now().UnixNano())/1e9) > 5 {
		t.Fatalf("t is not unix seconds: %v", smp.T)
	}
	c := smp.Conns[0]
	if c["slot"] != float64(slot) || c["pid"] != 77.0 || c["conn_id"] != 5.0 || c["is_send"] != 1.0 ||
		c["path_class"] != 1.0 || c["sout_state"] != "up" || c["sup_state"] != "down" ||
		c["sout_mbps"].(float64) <= 0 || c["sup_mbps"] != 0.0 || c["sout_completed_mbps"].(float64) <= 0 ||
		c["sup_completed_mbps"] != 0.0 || c["sout_latency_us"] != 250.0 || c["sup_latency_us"] != 0.0 ||
		c["sout_inflight_bytes"] != float64(1<<18) || c["flush_wall_ns"] != 1763856000000000001.0 {
		t.Fatalf("top --json connection: %v", c)
	}
	var raw struct{ Conns []json.RawMessage }
	json.Unmarshal([]byte(lines[1]), &raw)
	if k := jsonKeys(t, raw.Conns[0]); !reflect.DeepEqual(k, topKeys) {
		t.Fatalf("top --json connection keys: %v", k)
	}

	jl := filepath.Join(dir, "rec.jsonl")
	out.Reset()
	if err := cmdRecord([]string{"--path", path, "--out", jl, "--count", "2", "--interval", "50ms"}, &out); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(jl)
	if ls := strings.Split(strings.TrimSpace(string(b)), "\n"); len(ls) != 2 || !strings.HasPrefix(ls[0], `{"t":`) {
		t.Fatalf("record jsonl: %q", b)
	}
	cf := filepath.Join(dir, "rec.csv")
	if err := cmdRecord([]string{"--path", path, "--out", cf, "--format", "csv", "--count", "2", "--interval", "0.05"}, &out); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(mustOpen(t, cf)).ReadAll()
	if err != nil || len(rows) != 3 {
		t.Fatalf("record csv: %v %v", err, rows)
	}
	if !reflect.DeepEqual(rows[0], append([]string{"t"}, topKeys...)) || rows[1][1] != fmt.Sprint(slot) ||
		rows[1][10] != "up" || rows[1][11] != "down" || rows[1][6] != "1" {
		t.Fatalf("record csv: %v", rows)
	}
	for _, bad := range [][]string{{"--out", ""}, {"--out", cf, "--format", "xml"}, {"--out", cf, "--count", "-1"},
		{"--out", cf, "--interval", "0"}, {"--out", cf, "extra"}} {
		if err := cmdRecord(append([]string{"--path", path}, bad...), &out); errCode(err) != "usage" {
			t.Errorf("record %v: want a usage error, got %v", bad, err)
		}
	}
	if err := cmdRecord([]string{"--path", path, "--out", filepath.Join(dir, "no", "such", "dir"), "--count", "1"}, &out); errCode(err) != "io" {
		t.Errorf("record to a missing directory: want io, got %v", err)
	}
}

func mustOpen(t *testing.T, p string) *os.File {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestRunClosedLoopFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none")
	for _, bad := range [][]string{{"--step", "0"}, {"--step", "257"}, {"--step", "x"}, {"--step", "1.5"},
		{"--step", "-8"}, {"--step", ""}, {"--interval", "0"}, {"--interval", "abc"}} {
		args := append([]string{"--path", path, "--policy", "closed-loop"}, bad...)
		if err := cmdRun(args, &bytes.Buffer{}); errCode(err) != "usage" {
			t.Errorf("run %v: want a usage error, got %v", args, err)
		}
	}
	for _, ok := range [][]string{{"--step", "1"}, {"--step", "256"}, {"--step", "+16"}, {}} {
		args := append([]string{"--path", path, "--policy", "closed-loop"}, ok...)
		if err := cmdRun(args, &bytes.Buffer{}); errCode(err) != "io" { // flags fine; no segment there
			t.Errorf("run %v: want the flags accepted (then io: no segment), got %v", args, err)
		}
	}
}

// TestUsageNamesTopFields: --help names every field top --json and record write (it once
// named 11 of them).
func TestUsageNamesTopFields(t *testing.T) {
	typ := reflect.TypeOf(topConn{})
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !regexp.MustCompile(`\b` + name + `\b`).MatchString(usage) {
			t.Errorf("--help does not name the top --json field %q", name)
		}
	}
}
