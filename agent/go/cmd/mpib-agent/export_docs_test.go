package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
)

// exportedNames returns every metric name the exporter can write: those of a segment with
// connections, an agent and a rail down, and those of a missing segment.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	s, p := testSegment(t, 8)
	slot := register(t, p, 1, 0, "10.0.2.2", true)
	flush(t, p, slot, 100, 100, 512)
	p.SetRailState(slot, 1, shm.RailDown, 1)
	s.Beat(shm.Now())
	names := map[string]bool{}
	for _, e := range []*exporter{newExporter(s.Path(), 4), newExporter(filepath.Join(t.TempDir(), "none"), 4)} {
		res, _ := e.scrape()
		for _, f := range e.families(res) {
			names[f.name] = true
		}
	}
	return names
}

// metricRe finds metric names in PromQL and prose; mpib_agent alone is the Python package.
var metricRe = regexp.MustCompile(`\bmpib_[a-z0-9_]+`)

func unknownMetrics(text string, names map[string]bool) []string {
	var bad []string
	for _, m := range metricRe.FindAllString(text, -1) {
		if !names[m] && m != "mpib_agent" {
			bad = append(bad, m)
		}
	}
	sort.Strings(bad)
	return bad
}

// TestGrafanaDashboard: docs/grafana-dashboard.json is a dashboard whose panels all query
// metrics the exporter writes, with the fields Grafana needs to import it.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID, Title    string
		SchemaVersion int
		Templating    struct{ List []struct{ Name, Type string } }
		Panels        []struct {
			ID      int
			Type    string
			Title   string
			GridPos struct{ X, Y, W, H int }
			Targets []struct{ RefID, Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 || len(d.Panels) == 0 {
		t.Fatalf("dashboard lacks uid, title, schemaVersion or panels: %+v", d)
	}
	names := exportedNames(t)
	queried := map[string]bool{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] || p.GridPos.W == 0 || p.GridPos.H == 0 {
			t.Errorf("panel %q: duplicate id %d or no size", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, q := range p.Targets {
			if q.RefID == "" || q.Expr == "" {
				t.Errorf("panel %q: a target without refId or expr", p.Title)
			}
			if bad := unknownMetrics(q.Expr, names); len(bad) > 0 {
				t.Errorf("panel %q queries metrics the exporter does not write: %v", p.Title, bad)
			}
			for _, m := range metricRe.FindAllString(q.Expr, -1) {
				queried[m] = true
			}
		}
	}
	// The panels: per-rail throughput, split, rail state, failovers and recoveries,
	// heartbeat age.
	for _, m := range []string{"mpib_rail_posted_bytes_total", "mpib_split_sup_ratio", "mpib_rail_state_connections",
		"mpib_rail_failovers_total", "mpib_rail_recoveries_total", "mpib_agent_heartbeat_age_seconds"} {
		if !queried[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}

// TestMetricsDoc: docs/metrics.md names only metrics the exporter writes (its table, the
// alert rule, the examples), and every metric the exporter writes is in it.
func TestMetricsDoc(t *testing.T) {
	b, err := os.ReadFile("../../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	names := exportedNames(t)
	if bad := unknownMetrics(doc, names); len(bad) > 0 {
		t.Errorf("docs/metrics.md names metrics the exporter does not write: %v", bad)
	}
	for n := range names {
		if !strings.Contains(doc, "`"+n+"`") {
			t.Errorf("docs/metrics.md does not document `%s`", n)
		}
	}
	if !strings.Contains(doc, "alert: MPIBRailDown") || !strings.Contains(doc, "for: 1m") {
		t.Error("docs/metrics.md lacks the MPIBRailDown alert rule (a rail down for over a minute)")
	}
}
