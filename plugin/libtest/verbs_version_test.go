package libtest

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// maxIbverbsNode is the newest libibverbs version node the plugin may bind to at link time.
// The dynamic loader refuses the whole .so on an rdma-core without a node it names, so every
// newer verb goes through plugin/mpib_verbs.c (dlvsym at run time). IBVERBS_1.1 is in every
// rdma-core release, so the plugin loads on Ubuntu 20.04 (rdma-core 28) and RHEL 8 (32-37).
const maxIbverbsNode = "IBVERBS_1.1"

// ibverbsMinor returns N of "IBVERBS_1.N"; ok is false for any other name (IBVERBS_PRIVATE_*).
func ibverbsMinor(node string) (int, bool) {
	rest, found := strings.CutPrefix(node, "IBVERBS_1.")
	if !found {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil
}

// ibverbsImports lists the symbols the .so takes from libibverbs, as "name@NODE".
func ibverbsImports(t *testing.T, lib string) []string {
	t.Helper()
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatalf("open %s: %v", lib, err)
	}
	defer f.Close()
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatalf("imported symbols of %s: %v", lib, err)
	}
	var out []string
	for _, s := range syms {
		if strings.HasPrefix(s.Library, "libibverbs.so") || strings.HasPrefix(s.Version, "IBVERBS_") {
			out = append(out, s.Name+"@"+s.Version)
		}
	}
	sort.Strings(out)
	return out
}

// TestIbverbsVersionNodes fails on any libibverbs binding newer than maxIbverbsNode, naming
// each symbol@node: the fix is to call that verb through its mpib_ibv_* wrapper.
func TestIbverbsVersionNodes(t *testing.T) {
	lib := library(t)
	limit, _ := ibverbsMinor(maxIbverbsNode)
	imports := ibverbsImports(t, lib)
	if len(imports) == 0 {
		t.Fatalf("%s imports nothing from libibverbs: the ELF reading is broken", lib)
	}
	var bad []string
	for _, imp := range imports {
		_, node, _ := strings.Cut(imp, "@")
		if n, ok := ibverbsMinor(node); !ok || n > limit {
			bad = append(bad, imp)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("%s binds libibverbs symbols newer than %s, so it will not load on older rdma-core:\n  %s\n"+
			"call them through plugin/mpib_verbs.h instead", lib, maxIbverbsNode, strings.Join(bad, "\n  "))
	}
	t.Logf("libibverbs imports (all <= %s): %s", maxIbverbsNode, strings.Join(imports, " "))
}

// TestIbverbsVersionNeeds checks the version-needs section too: the loader checks these
// entries, even for a node no remaining symbol uses.
func TestIbverbsVersionNeeds(t *testing.T) {
	lib := library(t)
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatalf("open %s: %v", lib, err)
	}
	defer f.Close()
	needs, err := f.DynamicVersionNeeds()
	if err != nil {
		t.Fatalf("version needs of %s: %v", lib, err)
	}
	limit, _ := ibverbsMinor(maxIbverbsNode)
	var all, bad []string
	for _, need := range needs {
		for _, dep := range need.Needs {
			all = append(all, fmt.Sprintf("%s:%s", need.Name, dep.Dep))
			if n, ok := ibverbsMinor(dep.Dep); strings.HasPrefix(need.Name, "libibverbs.so") && (!ok || n > limit) {
				bad = append(bad, dep.Dep)
			}
		}
	}
	sort.Strings(all)
	t.Logf("version needs: %s", strings.Join(all, " "))
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Fatalf("%s needs libibverbs nodes newer than %s: %s", lib, maxIbverbsNode, strings.Join(bad, ", "))
	}
}

// TestLoadsOnIbverbs11Only loads the .so, RTLD_NOW, against a stand-in libibverbs.so.1 that
// defines only the nodes up to IBVERBS_1.1, as the oldest rdma-core would: the dynamic loader's
// own verdict, whose error names the missing node ("version `IBVERBS_1.12' not found").
func TestLoadsOnIbverbs11Only(t *testing.T) {
	lib := library(t)
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("skipping: gcc not found")
	}
	dir := t.TempDir()
	stubIbverbs(t, dir, ibverbsImports(t, lib))
	bin := filepath.Join(dir, "dlopen_check")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I../..", "-o", bin,
		"testdata/dlopen_check.c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, lib)
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("does not load on a libibverbs with only IBVERBS_1.0/1.1: %v\n%s", err, out)
	}
}

// stubIbverbs builds dir/libibverbs.so.1 exporting every imported name at IBVERBS_1.1, plus
// an empty IBVERBS_1.0. The stubs are never called: loading runs no verbs.
func stubIbverbs(t *testing.T, dir string, imports []string) {
	t.Helper()
	var src, names strings.Builder
	for _, imp := range imports {
		name, _, _ := strings.Cut(imp, "@")
		fmt.Fprintf(&src, "void %s(void) {}\n", name)
		fmt.Fprintf(&names, "%s; ", name)
	}
	script := "IBVERBS_1.0 { local: *; };\nIBVERBS_1.1 { global: " + names.String() + "} IBVERBS_1.0;\n"
	for name, text := range map[string]string{"stub.c": src.String(), "stub.map": script} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libibverbs.so.1",
		"-Wl,--version-script="+filepath.Join(dir, "stub.map"), "-o", filepath.Join(dir, "libibverbs.so.1"),
		filepath.Join(dir, "stub.c")).CombinedOutput()
	if err != nil {
		t.Fatalf("building the stand-in libibverbs: %v\n%s", err, out)
	}
}
