package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/internal/lab"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// TestExport runs on the host, without the lab: the Python simulator (a plugin with a rail
// model, real clock) drives a segment in a temporary directory through its "fail" scenario
// (SOUT 100, SUP 200 Gb/s; SUP down at 30 s, back at 45 s) four times faster than real time,
// the Go closed-loop agent steers it, and `mpib-agent export` serves it. The test scrapes
// /metrics over HTTP, lints every scrape with promlint (what `promtool check metrics` runs),
// checks the values against the segment, then waits for SUP to go down and come back and
// checks that the scrapes show both. Its lines:
//
//	export: metrics=N series=N promtool=pass scrape_ms=N
//	export: metrics=N series=N promtool=pass scrape_ms=N rail_down=sup failovers=N
//	export: metrics=N series=N promtool=pass scrape_ms=N rail_up=sup recoveries=N
func TestExport(t *testing.T) {
	root, err := lab.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(root, "build", "mpib-agent")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: build it first (go run mage.go agent:build)", err)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("the simulator needs python3: %v", err)
	}
	path := filepath.Join(t.TempDir(), "hints")
	start := time.Now()
	startProc(t, "sim", []string{"PYTHONPATH=" + filepath.Join(root, "agent", "python", "src")},
		"python3", "-m", "mpib_agent", "sim", "--scenario", "fail", "--speed", "4", "--path", path)
	conn := waitForConnection(t, path)
	t.Logf("simulator's connection in slot %d after %.1f s", conn.Index, time.Since(start).Seconds())
	startProc(t, "agent", nil, bin, "run", "--policy", "closed-loop", "--interval", "250ms", "--path", path)
	url := startExporter(t, bin, path)

	first := scrape(t, url)
	time.Sleep(time.Second)
	before := connTelemetry(t, path, conn)
	second := scrape(t, url)
	after := connTelemetry(t, path, conn)
	checkLive(t, first, second, before, after, conn)
	evidence("export:", "%s", second.summary())

	down := scrapeUntil(t, url, "SUP down", 30*time.Second, func(s scraped) bool {
		return s.value(t, "mpib_rail_state_connections", "rail", "sup", "state", "down") == 1
	})
	if got := railState(t, path, conn, 1); got != shm.RailDown {
		t.Errorf("segment's SUP state %v while the scrape showed it down", got)
	}
	failovers := down.value(t, "mpib_rail_failovers_total", "dir", "send")
	if failovers < 1 || down.value(t, "mpib_rail_state_connections", "rail", "sup", "state", "up") != 0 {
		t.Errorf("SUP down: failovers %v (want >= 1), still counted up", failovers)
	}
	evidence("export:", "%s rail_down=sup failovers=%g", down.summary(), failovers)

	up := scrapeUntil(t, url, "SUP back up", 30*time.Second, func(s scraped) bool {
		return s.value(t, "mpib_rail_state_connections", "rail", "sup", "state", "up") == 1
	})
	recoveries := up.value(t, "mpib_rail_recoveries_total", "dir", "send")
	if recoveries < 1 {
		t.Errorf("SUP back up: recoveries %v, want >= 1", recoveries)
	}
	evidence("export:", "%s rail_up=sup recoveries=%g", up.summary(), recoveries)
}

// startProc starts a command whose output goes to the test log when the test fails; the
// cleanup stops it with SIGTERM (the simulator releases its slots, the agent its heartbeat).
func startProc(t *testing.T, name string, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { stopProc(t, name, cmd, &out) })
	return cmd
}

func stopProc(t *testing.T, name string, cmd *exec.Cmd, out *bytes.Buffer) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	if t.Failed() {
		t.Logf("%s output:\n%s", name, out.String())
	}
}

// startExporter starts `mpib-agent export` on a free port and returns its /metrics URL, read
// from the first line it prints.
func startExporter(t *testing.T, bin, path string) string {
	t.Helper()
	cmd := exec.Command(bin, "export", "--listen", "127.0.0.1:0", "--path", path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start exporter: %v", err)
	}
	t.Cleanup(func() { stopProc(t, "exporter", cmd, &stderr) })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	go io.Copy(io.Discard, stdout) // it prints nothing more; never let it block on a full pipe
	m := regexp.MustCompile(`(http://\S+/metrics)`).FindStringSubmatch(line)
	if err != nil || m == nil {
		t.Fatalf("exporter's first line %q (%v); stderr: %s", line, err, stderr.String())
	}
	return m[1]
}

// waitForConnection waits for the simulator's segment and its active connection.
func waitForConnection(t *testing.T, path string) shm.Slot {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if s, err := shm.Open(path); err == nil {
			conns, err := s.Connections()
			s.Close()
			if err == nil && len(conns) == 1 {
				return conns[0]
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no simulated connection in %s after 30 s", path)
	return shm.Slot{}
}

// connTelemetry reads the connection's slot now; it fails the test when the slot holds
// another registration.
func connTelemetry(t *testing.T, path string, conn shm.Slot) shm.Telemetry {
	t.Helper()
	s, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sl, err := s.Slot(conn.Index)
	if err != nil || sl.Gen != conn.Gen || sl.State != shm.StateActive {
		t.Fatalf("slot %d: %v, gen %d state %v (want gen %d, active)", conn.Index, err, sl.Gen, sl.State, conn.Gen)
	}
	return sl.Telemetry
}

func railState(t *testing.T, path string, conn shm.Slot, rail int) shm.RailState {
	tel := connTelemetry(t, path, conn)
	if rail == 0 {
		return tel.SoutState
	}
	return tel.SupState
}

// scraped is one scrape of /metrics: its families, series count and duration.
type scraped struct {
	fams   map[string]*dto.MetricFamily
	series int
	took   time.Duration
}

func (s scraped) summary() string {
	return fmt.Sprintf("metrics=%d series=%d promtool=pass scrape_ms=%.1f", len(s.fams), s.series,
		float64(s.took.Microseconds())/1e3)
}

// scrape GETs url and lints the answer (a parse error or any promlint problem fails the test).
func scrape(t *testing.T, url string) scraped {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, %v", resp.StatusCode, err)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("promtool=fail: the exposition does not parse: %v\n%s", err, body)
	}
	for _, p := range problems {
		t.Errorf("promtool=fail: %s: %s", p.Metric, p.Text)
	}
	if len(problems) > 0 {
		t.FailNow()
	}
	s := scraped{fams: map[string]*dto.MetricFamily{}, took: took}
	d := expfmt.NewDecoder(bytes.NewReader(body), expfmt.NewFormat(expfmt.TypeTextPlain))
	for {
		mf := &dto.MetricFamily{}
		if d.Decode(mf) != nil {
			break
		}
		s.fams[mf.GetName()] = mf
		s.series += len(mf.GetMetric())
	}
	return s
}

// scrapeUntil scrapes every 100 ms until ok holds, failing the test after timeout.
func scrapeUntil(t *testing.T, url, what string, timeout time.Duration, ok func(scraped) bool) scraped {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := scrape(t, url)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no scrape showed %s within %v", what, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// value is the one sample of name whose labels include want (name, value pairs); it fails
// the test unless exactly one matches.
func (s scraped) value(t *testing.T, name string, want ...string) float64 {
	t.Helper()
	var vals []float64
next:
	for _, m := range s.fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		if m.Counter != nil {
			vals = append(vals, m.Counter.GetValue())
		} else {
			vals = append(vals, m.Gauge.GetValue())
		}
	}
	if len(vals) != 1 {
		t.Fatalf("%s%v: %d samples, want 1", name, want, len(vals))
	}
	return vals[0]
}

// checkLive checks two scrapes of the live connection against the segment read just before
// and after the second: its labels, counters between the two reads (so read at scrape time,
// not cached), moving between scrapes, a fresh heartbeat and the closed loop's hints.
func checkLive(t *testing.T, first, second scraped, before, after shm.Telemetry, conn shm.Slot) {
	t.Helper()
	key := []string{"dev", fmt.Sprint(conn.Dev), "peer", conn.PeerSoutIP.String(), "dir", "send"}
	for _, c := range []struct {
		name string
		want float64
	}{{"mpib_segment_up", 1}, {"mpib_agent_up", 1}} {
		if got := second.value(t, c.name); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if n := second.value(t, "mpib_connections", key...); n != 1 {
		t.Errorf("mpib_connections%v = %v, want 1", key, n)
	}
	if age := second.value(t, "mpib_agent_heartbeat_age_seconds"); age < 0 || age > 1 {
		t.Errorf("heartbeat age %v s: the agent beats every 125 ms", age)
	}
	rails := []struct {
		name          string
		before, after uint64
	}{{"sout", before.SoutBytes, after.SoutBytes}, {"sup", before.SupBytes, after.SupBytes}}
	total := [2]float64{}
	for _, r := range rails {
		got := second.value(t, "mpib_rail_posted_bytes_total", append(key, "rail", r.name)...)
		if got < float64(r.before) || got > float64(r.after) {
			t.Errorf("%s posted bytes %v, segment read %d before and %d after the scrape", r.name, got, r.before, r.after)
		}
		total[0] += first.value(t, "mpib_rail_posted_bytes_total", append(key, "rail", r.name)...)
		total[1] += got
	}
	if total[1] <= total[0] {
		t.Errorf("posted bytes did not move in a second: %v then %v", total[0], total[1])
	}
	src := second.value(t, "mpib_split_source_connections", "dev", key[1], "peer", key[3], "source", "slot")
	if ratio := second.value(t, "mpib_split_sup_ratio", "dev", key[1], "peer", key[3]); src != 1 || ratio < 0 || ratio > 1 {
		t.Errorf("split: %v connections steered by a slot hint (want 1), SUP ratio %v", src, ratio)
	}
	t.Logf("metric names: %s", strings.Join(names(second), " "))
}

func names(s scraped) []string {
	var out []string
	for n := range s.fams {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
