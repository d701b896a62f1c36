// Package libtest checks the built libnccl-net-mpib.so as NCCL sees it: which symbols it
// exports, what it links against, and that it loads with RTLD_NOW.
package libtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func library(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../build/libnccl-net-mpib.so")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s missing: the mage build target must run before the tests", p)
		}
		t.Skipf("skipping: %s not built (run `go run mage.go build`)", p)
	}
	return p
}

func TestExportsOnlyPluginTables(t *testing.T) {
	out, err := exec.Command("nm", "-D", "--defined-only", library(t)).Output()
	if err != nil {
		t.Fatalf("nm: %v", err)
	}
	var syms []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 3 {
			syms = append(syms, f[2])
		}
	}
	sort.Strings(syms)
	want := []string{"ncclNetPlugin_v10", "ncclNetPlugin_v11", "ncclNetPlugin_v12", "ncclNetPlugin_v7", "ncclNetPlugin_v8", "ncclNetPlugin_v9"}
	if strings.Join(syms, ",") != strings.Join(want, ",") {
		t.Fatalf("exported symbols = %v, want exactly %v", syms, want)
	}
}

func TestNeedsOnlyLibibverbsAndLibc(t *testing.T) {
	out, err := exec.Command("readelf", "-d", library(t)).Output()
	if err != nil {
		t.Fatalf("readelf: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, "(NEEDED)") {
			continue
		}
		if !strings.Contains(line, "[libibverbs.so.1]") && !strings.Contains(line, "[libc.so.6]") {
			t.Errorf("unexpected dependency: %s", strings.TrimSpace(line))
		}
	}
}

func TestLoadsWithRTLDNow(t *testing.T) {
	lib := library(t)
	bin := filepath.Join(t.TempDir(), "dlopen_check")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I../..", "-o", bin, "testdata/dlopen_check.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, lib).CombinedOutput()
	if err != nil {
		t.Fatalf("dlopen check failed: %v\n%s", err, out)
	}
}

// The test driver's own checks (modes, fault detection, usage errors) against a TCP fake
// plugin. This tests mpib-nettest, not MPIB: the plugin itself is proven on soft-RoCE.
func TestNettestDriverSelfCheck(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("skipping: gcc not found")
	}
	cmd := exec.Command("bash", "plugin/nettest/fake/test_nettest.sh")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "\n0 failure(s)") {
		t.Fatalf("nettest self-check failed: %v\n%s", err, out)
	}
}

// A child forked after the plugin loaded gets ncclSystemError and a warning naming the fork
// from every control call, at once, instead of waiting on threads that stayed in the parent.
func TestForkedChildIsRefused(t *testing.T) {
	lib := library(t)
	bin := filepath.Join(t.TempDir(), "fork_check")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I../..", "-o", bin, "testdata/fork_check.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, lib).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "fork_check: ok") {
		t.Fatalf("fork check failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
