package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// bench_report.py --table-only (no matplotlib): the results table between the markers, with
// each ratio's median and 90 % interval, the pairs, and the second reference.
func TestBenchReportTable(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("p1.json", `[{"name":"P1","key":"size=1048576","ratio":0.91,"ci_low":0.85,"ci_high":0.97,"pairs":7,
		"plugin":140.2,"ref":154.1,"unit":"mbps","ratios":[0.9,0.91,0.85,0.97,0.92,0.88,0.95],
		"alt_label":"ib_write_bw --tx-depth 8","alt_ref":141.0,"alt_ratio":0.99,"alt_ci_low":0.95,"alt_ci_high":1.02}]`)
	write("p3.json", `[{"name":"P3","key":"size=8","ratio":1.4,"ci_low":1.3,"ci_high":1.5,"pairs":7,"plugin":300,"ref":214,
		"unit":"us","ratios":[1.4,1.3,1.5],"preposted":true,"note":"packets"}]`)
	write("p4.json", `[{"name":"P4","key":"size=4096 mode=advanced","ratio":0,"plugin":1500,"ref":0,"unit":"instructions","ratios":null,"mode":"advanced"}]`)
	write("mesh.json", `[{"name":"mesh-bw","key":"pair=b1-b3 path=routed via=b2","ratio":0.93,"ci_low":0.9,"ci_high":0.96,"pairs":3,
		"plugin":21.5,"ref":23.1,"unit":"mbps","ratios":[0.93,0.9,0.96]}]`)
	doc := filepath.Join(dir, "bench.md")
	if err := os.WriteFile(doc, []byte("# B\n<!-- results:begin -->\nold\n<!-- results:end -->\ntail\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(py, "bench_report.py", "--table-only", dir, doc).CombinedOutput()
	if err != nil {
		t.Fatalf("bench_report.py: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(doc)
	text := string(b)
	for _, want := range []string{
		"| P1 | size=1048576 | 0.910 [0.850, 0.970] | 7 | 140.2 mbps | 154.1 mbps | ib_write_bw --tx-depth 8: 0.990 [0.950, 1.020] (141.0 mbps) |",
		"| P3 | size=8 preposted=true | 1.400 [1.300, 1.500] | 7 |",
		"| P4 | size=4096 mode=advanced | - | - | 1,500 instructions | - | - | <= 1,000 instructions; advanced <= vanilla + 150 |",
		"| mesh-bw | pair=b1-b3 path=routed via=b2 | 0.930 [0.900, 0.960] | 3 | 21.5 mbps | 23.1 mbps | - | >= 0.95 direct, >= 0.90 routed",
		"<!-- results:end -->\ntail\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "old") {
		t.Errorf("the old table is still there:\n%s", text)
	}
}
