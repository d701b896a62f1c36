package ctest

// Runner for the plugin's pure-C unit tests.
//
// Convention: every plugin/ctest/*_test.c is one test program. Its header lines are
//
//	//go:build ignore            (required: keeps the go tool from treating it as cgo source)
//	// link: ../a.c ../b_*.c     (optional: pure C files to compile with it, relative to here;
//	                             a pattern names every file it matches, in order)
//	// cflags: -DFOO             (optional: extra compiler flags)
//
// It is built with gcc -std=gnu11 -O1 -g -Wall -Wextra -Werror -pthread -I.. (plus
// AddressSanitizer and UndefinedBehaviorSanitizer when the toolchain has them), run with
// plugin/ctest as its working directory and MPIB_SHM_VECTORS set to testdata/shm, and
// passes when it exits 0. Missing gcc skips the suite.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

type cprog struct {
	src    string
	links  []string
	cflags []string
}

func parseHeader(t *testing.T, src string) cprog {
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := cprog{src: src}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "//go:build") {
			continue
		}
		if !strings.HasPrefix(line, "//") {
			break
		}
		body := strings.TrimSpace(strings.TrimPrefix(line, "//"))
		if v, ok := strings.CutPrefix(body, "link:"); ok {
			for _, f := range strings.Fields(v) {
				p.links = append(p.links, expandLink(t, src, f)...)
			}
		} else if v, ok := strings.CutPrefix(body, "cflags:"); ok {
			p.cflags = append(p.cflags, strings.Fields(v)...)
		}
	}
	return p
}

// expandLink expands a link: entry that is a file pattern (an option such as -ldl, or a plain
// path, stays as it is); a pattern that matches nothing fails the test.
func expandLink(t *testing.T, src, f string) []string {
	if strings.HasPrefix(f, "-") || !strings.ContainsAny(f, "*?[") {
		return []string{f}
	}
	files, err := filepath.Glob(f)
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: link: %s matches no file (%v)", src, f, err)
	}
	return files
}

var sanOnce sync.Once
var sanFlags []string

// sanitizers returns ASan/UBSan flags when gcc can link with them here.
func sanitizers(t *testing.T, gcc string) []string {
	sanOnce.Do(func() {
		dir := t.TempDir()
		src := filepath.Join(dir, "probe.c")
		os.WriteFile(src, []byte("int main(void){return 0;}\n"), 0o644)
		flags := []string{"-fsanitize=address,undefined", "-fno-omit-frame-pointer"}
		bin := filepath.Join(dir, "probe")
		if exec.Command(gcc, append(flags, "-o", bin, src)...).Run() == nil &&
			exec.Command(bin).Run() == nil {
			sanFlags = flags
		}
	})
	return sanFlags
}

func TestC(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the C unit tests need gcc")
	}
	srcs, err := filepath.Glob("*_test.c")
	if err != nil || len(srcs) == 0 {
		t.Fatalf("no *_test.c in plugin/ctest: %v", err)
	}
	vectors, _ := filepath.Abs("../../testdata/shm")
	san := sanitizers(t, gcc)
	for _, src := range srcs {
		p := parseHeader(t, src)
		t.Run(strings.TrimSuffix(src, ".c"), func(t *testing.T) {
			t.Parallel()
			bin := filepath.Join(t.TempDir(), strings.TrimSuffix(src, ".c"))
			args := []string{"-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-I.."}
			args = append(append(append(args, san...), p.cflags...), "-o", bin, p.src)
			args = append(args, p.links...)
			if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
				t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), "MPIB_SHM_VECTORS="+vectors, "ASAN_OPTIONS=detect_leaks=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", src, err, out)
			}
			t.Logf("%s", out)
		})
	}
}

// TestShmPureC11 compiles the segment reader (every plugin/mpib_shm_*.c) and the C tests'
// agent-side writers and decoders as strict ISO C11: they must not need GNU C or cgo.
func TestShmPureC11(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	srcs, _ := filepath.Glob("../mpib_shm_*.c")
	if len(srcs) == 0 {
		t.Fatal("no ../mpib_shm_*.c")
	}
	for _, src := range append(srcs, shmSupportSources...) {
		out, err := exec.Command(gcc, "-std=c11", "-pedantic-errors", "-Wall", "-Wextra", "-Werror",
			"-fsyntax-only", src).CombinedOutput()
		if err != nil {
			t.Errorf("%s is not clean C11: %v\n%s", src, err, out)
		}
	}
}

// pluginOptFlag is the optimisation flag (-O<n>) of the plugin's own build: the #cgo CFLAGS
// line in plugin/plugin.go. The hot-path count and the failover model use it, so that they
// count and check the instructions NCCL runs.
func pluginOptFlag(t *testing.T) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "plugin.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "#cgo CFLAGS:") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "-O") {
				return f
			}
		}
	}
	t.Fatal("plugin/plugin.go: no -O flag on its #cgo CFLAGS line")
	return ""
}
