package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// scrapeText runs one scrape of e and returns the exposition text.
func scrapeText(t *testing.T, e *exporter) string {
	t.Helper()
	res, _ := e.scrape()
	var b bytes.Buffer
	if err := writeText(&b, e.families(res)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// lint fails the test unless text parses and promlint (what `promtool check metrics` runs)
// finds no problem; it returns the parsed families by name.
func lint(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("exposition does not parse: %v\n%s", err, text)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	fams := map[string]*dto.MetricFamily{}
	d := expfmt.NewDecoder(strings.NewReader(text), expfmt.NewFormat(expfmt.TypeTextPlain))
	for {
		mf := &dto.MetricFamily{}
		if err := d.Decode(mf); err != nil {
			break
		}
		fams[mf.GetName()] = mf
	}
	return fams
}

// value returns the sample of family name whose labels include want; it fails the test when
// there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	t.Helper()
	v, ok := lookup(fams, name, want...)
	if !ok {
		t.Fatalf("no sample %s%v", name, want)
	}
	return v
}

func lookup(fams map[string]*dto.MetricFamily, name string, want ...string) (float64, bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(want); i += 2 {
			if have[want[i]] != want[i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// testSegment creates a segment of nslots slots in a temporary directory and attaches an
// emulated plugin to it (the connections' side).
func testSegment(t *testing.T, nslots uint32) (*shm.Segment, *emulate.Plugin) {
	t.Helper()
	s, err := shm.Create(filepath.Join(t.TempDir(), "hints"), nslots, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, attachPlugin(t, s.Path())
}

// attachPlugin attaches an emulated plugin to the segment at path until the test ends.
func attachPlugin(t *testing.T, path string) *emulate.Plugin {
	t.Helper()
	p, err := emulate.Attach(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func register(t *testing.T, p *emulate.Plugin, connID uint64, dev uint16, peer string, send bool) uint32 {
	t.Helper()
	ip, err := shm.ParseIPv4(peer)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := p.Register(emulate.ConnDesc{PeerSoutIP: ip, IsSend: send, NQPsSout: 1, NQPsSup: 1, PID: 4242,
		ConnID: connID, Dev: dev, Ports: [2]uint8{1, 1}, NICs: [2]string{"mlx5_0", "mlx5_1"}})
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// flush publishes a batch: soutB and supB bytes posted (and completed), one request each.
func flush(t *testing.T, p *emulate.Plugin, slot uint32, soutB, supB uint64, applied uint32) {
	t.Helper()
	b := emulate.TelemetryBatch{AppliedSupBw: applied, WallNs: 1}
	for r, n := range []uint64{soutB, supB} {
		b.Rails[r] = emulate.RailBatch{PostedBytes: n, PostedRequests: 1, CompletedBytes: n, CompletedRequests: 1, BusyNs: 2e6}
	}
	if err := p.FlushTelemetry(slot, b); err != nil {
		t.Fatal(err)
	}
}

// TestExportLint: a segment with send and receive connections on two devices and two peers,
// an agent beating and a rail down gives metrics that parse and pass promlint, with the
// values the segment holds.
func TestExportLint(t *testing.T) {
	s, p := testSegment(t, 64)
	a := register(t, p, 1, 0, "10.0.2.2", true)
	b := register(t, p, 2, 0, "10.0.2.2", true)
	register(t, p, 3, 1, "10.0.3.2", false)
	flush(t, p, a, 1000, 3000, 768)
	flush(t, p, b, 500, 0, 256)
	for _, st := range []shm.RailState{shm.RailDown, shm.RailUp, shm.RailDown} { // a failover, a recovery, a failover
		if err := p.SetRailState(b, 1, st, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Beat(shm.Now()); err != nil {
		t.Fatal(err)
	}
	p.RecordRead(a, shm.Resolution{Applies: true, SupBw: 768, Source: shm.SourceSlot}, shm.Now())
	e := newExporter(s.Path(), defaultMaxPeers)
	fams := lint(t, scrapeText(t, e))

	send := []string{"dev", "0", "peer", "10.0.2.2", "dir", "send"}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"mpib_segment_up", nil, 1},
		{"mpib_agent_up", nil, 1},
		{"mpib_segment_slots", nil, 64},
		{"mpib_connections", send, 2},
		{"mpib_connections", []string{"dev", "1", "peer", "10.0.3.2", "dir", "recv"}, 1},
		{"mpib_rail_posted_bytes_total", append(send, "rail", "sout"), 1500},
		{"mpib_rail_posted_bytes_total", append(send, "rail", "sup"), 3000},
		{"mpib_rail_posted_requests_total", append(send, "rail", "sout"), 2},
		{"mpib_rail_completed_bytes_total", append(send, "rail", "sup"), 3000},
		{"mpib_rail_busy_seconds_total", append(send, "rail", "sout"), 0.004},
		{"mpib_rail_state_connections", append(send, "rail", "sup", "state", "down"), 1},
		{"mpib_rail_state_connections", append(send, "rail", "sup", "state", "up"), 1},
		{"mpib_rail_state_connections", append(send, "rail", "sout", "state", "up"), 2},
		{"mpib_rail_failovers_total", send, 2},
		{"mpib_rail_recoveries_total", send, 1},
		{"mpib_split_sup_ratio", []string{"dev", "0", "peer", "10.0.2.2"}, 0.5}, // (768+256)/2/1024
		{"mpib_split_source_connections", []string{"dev", "0", "source", "slot"}, 1},
		{"mpib_split_source_connections", []string{"dev", "0", "source", "no_hint"}, 1},
		{"mpib_device_info", []string{"dev", "1", "sout_nic", "mlx5_0", "sup_nic", "mlx5_1"}, 1},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if age := value(t, fams, "mpib_agent_heartbeat_age_seconds"); age < 0 || age > 5 {
		t.Errorf("heartbeat age %v s, want a fresh beat", age)
	}
	if _, ok := lookup(fams, "mpib_split_sup_ratio", "dev", "1"); ok {
		t.Error("a receive-only device has a split")
	}
}

// TestExportCountersMonotonic: a key's counters never fall when its connections close and
// their slot is claimed again (the new registration's counters start at 0), nor when the
// segment is replaced; the bytes a connection moved after a scrape and before it closed count.
func TestExportCountersMonotonic(t *testing.T) {
	s, p := testSegment(t, 1) // one slot: every registration reuses it
	e := newExporter(s.Path(), defaultMaxPeers)
	posted := func() float64 {
		t.Helper()
		return value(t, lint(t, scrapeText(t, e)), "mpib_rail_posted_bytes_total",
			"peer", "10.0.2.2", "dir", "send", "rail", "sout")
	}
	a := register(t, p, 1, 0, "10.0.2.2", true)
	flush(t, p, a, 1000, 0, 0)
	if got := posted(); got != 1000 {
		t.Fatalf("first connection: %v bytes, want 1000", got)
	}
	flush(t, p, a, 500, 0, 0) // its last batch, then it closes before the next scrape
	if err := p.Release(a); err != nil {
		t.Fatal(err)
	}
	if got := posted(); got != 1500 {
		t.Fatalf("closed connection: %v bytes, want its final 1500", got)
	}
	b := register(t, p, 2, 0, "10.0.2.2", true)
	if b != a {
		t.Fatalf("second registration in slot %d, want the reused slot %d", b, a)
	}
	flush(t, p, b, 2000, 0, 0) // more than the first connection's total: no fall for rate() to see
	if got := posted(); got != 3500 {
		t.Fatalf("slot re-registered: %v bytes, want 1500 + 2000", got)
	}
	if err := p.Release(b); err != nil {
		t.Fatal(err)
	}
	c := register(t, p, 3, 0, "10.0.9.9", true) // another peer in the same slot
	flush(t, p, c, 7, 0, 0)
	if got := posted(); got != 3500 {
		t.Fatalf("peer's counter after its slot went to another peer: %v, want 3500", got)
	}
	s2, err := shm.Create(s.Path(), 1, 4, true) // a new segment at the path
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	p2 := attachPlugin(t, s2.Path())
	d := register(t, p2, 4, 0, "10.0.2.2", true)
	flush(t, p2, d, 10, 0, 0)
	if got := posted(); got != 3510 {
		t.Fatalf("segment replaced: %v bytes, want 3500 + 10", got)
	}
}

// TestExportMaxPeers: past --max-peers, new (dev, peer) pairs are summed under peer="other"
// and the pairs already tracked keep their series.
func TestExportMaxPeers(t *testing.T) {
	s, p := testSegment(t, 64)
	for i, peer := range []string{"10.0.2.2", "10.0.2.3", "10.0.2.4", "10.0.2.5"} {
		slot := register(t, p, uint64(i+1), 0, peer, true)
		flush(t, p, slot, uint64(100*(i+1)), 0, 0)
	}
	e := newExporter(s.Path(), 2)
	fams := lint(t, scrapeText(t, e))
	peers := map[string]bool{}
	for _, m := range fams["mpib_connections"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "peer" {
				peers[l.GetValue()] = true
			}
		}
	}
	if len(peers) != 3 || !peers[otherLabel] {
		t.Fatalf("peers %v: want the first two and %q", peers, otherLabel)
	}
	// Slots are visited in index order, which is not the order above: sum every peer instead.
	total := 0.0
	for p := range peers {
		total += value(t, fams, "mpib_rail_posted_bytes_total", "peer", p, "rail", "sout")
	}
	if total != 1000 {
		t.Errorf("bytes over all peers %v, want 1000", total)
	}
	if n := value(t, fams, "mpib_connections", "peer", otherLabel); n != 2 {
		t.Errorf("connections under peer=other: %v, want 2", n)
	}
}

// TestExportIdlePairs: a pair without active connections for pairIdle leaves the output and
// frees its place under --max-peers for a new peer; a connection keeps its series meanwhile.
func TestExportIdlePairs(t *testing.T) {
	s, p := testSegment(t, 64)
	e := newExporter(s.Path(), 1)
	clock := uint64(1e12)
	e.now = func() uint64 { return clock }
	peers := func() map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, m := range lint(t, scrapeText(t, e))["mpib_rail_posted_bytes_total"].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["rail"] == "sout" {
				out[l["peer"]] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	a := register(t, p, 1, 0, "10.0.2.2", true)
	flush(t, p, a, 100, 0, 0)
	peers()
	p.Release(a)
	b := register(t, p, 2, 0, "10.0.2.3", true)
	flush(t, p, b, 20, 0, 0)
	clock += uint64(time.Minute)
	if got := peers(); len(got) != 2 || got["10.0.2.2"] != 100 || got[otherLabel] != 20 {
		t.Fatalf("one pair allowed: %v, want 10.0.2.2's 100 bytes and 20 under other", got)
	}
	clock += uint64(pairIdle)
	c := register(t, p, 3, 0, "10.0.2.4", true)
	flush(t, p, c, 3, 0, 0)
	if got := peers(); len(got) != 2 || got["10.0.2.4"] != 3 || got[otherLabel] != 20 { // 10.0.2.2 dropped first
		t.Fatalf("after 10.0.2.2 was idle for %v: %v, want 10.0.2.4's 3 bytes and 20 under other", pairIdle, got)
	}
	clock += 2 * uint64(pairIdle) // no scrape for a while: an active pair is not idle
	if got := peers(); got["10.0.2.4"] != 3 {
		t.Fatalf("active 10.0.2.4 after a scrape gap: %v, want its series kept", got)
	}
	p.Release(c)
	clock += uint64(pairIdle) - 1
	if got := peers(); got["10.0.2.4"] != 3 {
		t.Fatalf("10.0.2.4 closed %v ago: %v, want its series kept", pairIdle-1, got)
	}
	clock++
	if got := peers(); len(got) != 1 {
		t.Fatalf("10.0.2.4 closed %v ago: %v, want only other's series", pairIdle, got)
	}
}

// TestExportBadSegment: a missing or invalid segment gives mpib_segment_up 0 and the error's
// code, still valid for promlint, and the exporter goes on once a segment appears.
func TestExportBadSegment(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hints")
	e := newExporter(path, defaultMaxPeers)
	for _, c := range []struct {
		setup func()
		code  string
	}{
		{func() {}, "missing"},
		{func() { os.WriteFile(path, bytes.Repeat([]byte{0xAB}, 4096), 0o600) }, "bad_magic"},
		{func() { os.WriteFile(path, []byte("MPIB"), 0o600) }, "too_small"},
		{func() { os.Chmod(path, 0o666) }, "bad_mode"},
		{func() { os.Remove(path); os.Symlink("/dev/null", path) }, "not_regular"},
	} {
		c.setup()
		fams := lint(t, scrapeText(t, e))
		if up := value(t, fams, "mpib_segment_up"); up != 0 {
			t.Errorf("%s: mpib_segment_up %v, want 0", c.code, up)
		}
		if v := value(t, fams, "mpib_segment_error_info", "code", c.code); v != 1 {
			t.Errorf("%s: error info %v, want 1", c.code, v)
		}
	}
	os.Remove(path)
	s, err := shm.Create(path, 8, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fams := lint(t, scrapeText(t, e))
	if up := value(t, fams, "mpib_segment_up"); up != 1 {
		t.Errorf("segment created: mpib_segment_up %v, want 1", up)
	}
	if _, ok := lookup(fams, "mpib_segment_error_info"); ok {
		t.Error("error info after the segment became readable")
	}
}

// TestExportHTTP: /metrics in the text format, an index page, nothing else.
func TestExportHTTP(t *testing.T) {
	s, _ := testSegment(t, 8)
	srv := httptest.NewServer(newExporter(s.Path(), defaultMaxPeers).handler())
	defer srv.Close()
	for _, c := range []struct {
		method, path string
		status       int
		ctype        string
	}{
		{"GET", "/metrics", 200, textContentType},
		{"HEAD", "/metrics", 200, textContentType},
		{"GET", "/", 200, "text/html; charset=utf-8"},
		{"GET", "/nope", 404, ""},
		{"POST", "/metrics", 405, ""},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || (c.ctype != "" && resp.Header.Get("Content-Type") != c.ctype) {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), c.status, c.ctype)
		}
	}
}

// TestExportUsage: export needs a sane --max-peers and refuses a reachable --listen.
func TestExportUsage(t *testing.T) {
	for _, args := range [][]string{{"--listen", "127.0.0.1:0", "--max-peers", "0"}, {"--listen", "127.0.0.1:0", "--max-peers", "x"},
		{"--listen", ":0"}, {"--listen", "0.0.0.0:0"}, {"--listen", "nohostport"}} {
		if code := errCode(cmdExport(args, &bytes.Buffer{})); code != "usage" {
			t.Errorf("export %v: code %q, want usage", args, code)
		}
	}
}

// TestExportTextEscaping: label values and help text are escaped as the format requires.
func TestExportTextEscaping(t *testing.T) {
	f := gaugeFamily("mpib_test_info", "a \\ help\nline")
	f.add(1, "nic", "a\"b\\c\nd")
	var b bytes.Buffer
	if err := writeText(&b, []*family{f}); err != nil {
		t.Fatal(err)
	}
	want := "# HELP mpib_test_info a \\\\ help\\nline\n# TYPE mpib_test_info gauge\n" +
		"mpib_test_info{nic=\"a\\\"b\\\\c\\nd\"} 1\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
	fams := lint(t, b.String())
	if got := fams["mpib_test_info"].GetMetric()[0].GetLabel()[0].GetValue(); got != "a\"b\\c\nd" {
		t.Errorf("label reads back as %q", got)
	}
}

// metricNames returns the metric names of a scrape, sorted.
func metricNames(fams map[string]*dto.MetricFamily) []string {
	var out []string
	for n := range fams {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
