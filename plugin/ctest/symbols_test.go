package ctest

// The C tests' support files (plugin/ctest/*.c other than *_test.c: the agent-side writers
// and the test-only decoders of the hint segment) are test code: none of their functions may
// be in the product library. The functions are listed from the sources (each file compiled
// here at -O0, so that every static function stays), the library's from its symbol tables.

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// productLib is what `go run mage.go build` writes (MPIB_PRODUCT_LIB names another).
const productLib = "../../build/libnccl-net-mpib.so"

// shmSupportSources are the C tests' support files (compiled with the tests that name them on
// their link: line, never into the plugin).
var shmSupportSources = supportSources()

func supportSources() []string {
	all, _ := filepath.Glob("*.c")
	var out []string
	for _, f := range all {
		if !strings.HasSuffix(f, "_test.c") {
			out = append(out, f)
		}
	}
	return out
}

// nmNames runs nm with args and returns the names of the symbols whose type is in types
// (a suffix such as .constprop.0 or .cold that the compiler adds is cut off).
func nmNames(t *testing.T, types string, args ...string) map[string]bool {
	t.Helper()
	out, err := exec.Command("nm", args...).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", strings.Join(args, " "), err)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		typ, name := f[len(f)-2], f[len(f)-1]
		if !strings.Contains(types, typ) {
			continue
		}
		if i := strings.IndexByte(name, '.'); i > 0 {
			name = name[:i]
		}
		names[name] = true
	}
	return names
}

// definedIn returns the functions of object obj whose definition is in the file src (from
// the object's line information: nm -l).
func definedIn(t *testing.T, obj, src string) map[string]bool {
	t.Helper()
	out, err := exec.Command("nm", "-l", "--defined-only", obj).Output()
	if err != nil {
		t.Fatalf("nm -l %s: %v", obj, err)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		sym, loc, ok := strings.Cut(sc.Text(), "\t")
		f := strings.Fields(sym)
		if !ok || len(f) != 3 || (f[1] != "T" && f[1] != "t") {
			continue
		}
		if file, _, _ := strings.Cut(loc, ":"); filepath.Base(file) == filepath.Base(src) {
			names[f[2]] = true
		}
	}
	return names
}

func TestNoTestSupportInProduct(t *testing.T) {
	lib := os.Getenv("MPIB_PRODUCT_LIB") // another build to check, e.g. an installed one
	if lib == "" {
		lib = productLib
	}
	lib, _ = filepath.Abs(lib)
	st, err := os.Stat(lib)
	if err != nil {
		t.Skipf("SKIPPED, nothing checked: %s is absent (build it with `go run mage.go build`): %v", lib, err)
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("SKIPPED, nothing checked: gcc not found (the support files' functions are listed by compiling them)")
	}
	if _, err := exec.LookPath("nm"); err != nil {
		t.Skip("SKIPPED, nothing checked: nm not found (binutils)")
	}
	if len(shmSupportSources) == 0 {
		t.Fatal("no test-support C files in plugin/ctest (*.c other than *_test.c)")
	}
	// Every function the support files define, statics included; not the inline functions of
	// the plugin's headers they include (the plugin has those too).
	defined := map[string]string{}
	for _, src := range shmSupportSources {
		obj := filepath.Join(t.TempDir(), strings.TrimSuffix(src, ".c")+".o")
		if out, err := exec.Command(gcc, "-std=gnu11", "-O0", "-g", "-I..", "-c", "-o", obj, src).CombinedOutput(); err != nil {
			t.Fatalf("gcc -c %s: %v\n%s", src, err, out)
		}
		for name := range definedIn(t, obj, src) {
			defined[name] = src
		}
	}
	if len(defined) == 0 {
		t.Fatalf("no function found in %v", shmSupportSources)
	}
	static := nmNames(t, "TtWw", "--defined-only", lib)
	dynamic := nmNames(t, "TtWwDdBbRr", "-D", "--defined-only", lib)
	// The static symbol table must be there (the build keeps it), or an absent name proves
	// nothing: a function every build has must be named in it.
	if !static["mpib_shm_read_hint"] {
		t.Fatalf("%s: nm names no mpib_shm_read_hint: no static symbol table, nothing can be checked", lib)
	}
	var names, found []string
	for name, src := range defined {
		names = append(names, name)
		if static[name] || dynamic[name] {
			found = append(found, name+" ("+src+")")
		}
	}
	sort.Strings(names)
	sort.Strings(found)
	t.Logf("%s (built %s): %d functions of %v checked against nm and nm -D: %s", lib,
		st.ModTime().UTC().Format("2006-01-02 15:04:05Z"), len(names), shmSupportSources, strings.Join(names, " "))
	if len(found) > 0 {
		t.Fatalf("test-only functions in the product library %s: %s", lib, strings.Join(found, ", "))
	}
}
