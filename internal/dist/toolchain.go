package dist

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// The release's C toolchain is Zig's clang with Zig's glibc stubs, from PyPI: it links
// against glibc 2.28's symbol versions whatever glibc the build host runs, so the binaries
// load on RHEL 8 and newer.
const (
	zigPackage   = "ziglang==0.15.2"
	buildPackage = "build>=1.0" // PyPA's PEP 517 front end, for the Python agent's wheel and sdist
	zigTarget    = "x86_64-linux-gnu.2.28"
)

// Toolchain is what the release build compiles with.
type Toolchain struct {
	Python                 string // the tools venv's interpreter (ziglang, build)
	CC                     string // a wrapper script: Zig's cc for zigTarget (cgo and the Go runtime use it)
	VerbsInclude, VerbsLib string // rdma-core's headers and libibverbs alone, for -I and -L
}

// verbsHeaders and verbsSonames are where libibverbs-dev (Debian) or rdma-core-devel (RHEL)
// put the headers and the library.
var (
	verbsHeaders = "/usr/include/infiniband"
	verbsSonames = []string{"/usr/lib/x86_64-linux-gnu/libibverbs.so.1", "/usr/lib64/libibverbs.so.1"}
)

// SetupToolchain creates the tools venv at dir with python (once; pip checks the pins each
// time) and writes the CC wrapper and the rdma-core folders under it.
func SetupToolchain(dir, python string, log io.Writer) (Toolchain, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return Toolchain{}, err
	}
	tc := Toolchain{Python: filepath.Join(abs, "bin", "python3"), CC: filepath.Join(abs, "zig-cc"),
		VerbsInclude: filepath.Join(abs, "verbs", "include"), VerbsLib: filepath.Join(abs, "verbs", "lib")}
	if _, err := os.Stat(tc.Python); err != nil {
		if err := run(log, "", nil, python, "-m", "venv", abs); err != nil {
			return tc, fmt.Errorf("creating the tools venv %s (apt-get install python3-venv): %w", abs, err)
		}
	}
	if err := run(log, "", nil, tc.Python, "-m", "pip", "install", "-q", "--disable-pip-version-check", zigPackage, buildPackage); err != nil {
		return tc, fmt.Errorf("installing %s and %s from PyPI: %w", zigPackage, buildPackage, err)
	}
	// The wrapper drops -Wl,-S (Go's -w asks the external linker to strip debug info): Zig's
	// linker strips the static symbol table with it, which gdb and perf need to name the data
	// path's functions in a user's process, as magefile's buildPlugin keeps it.
	script := fmt.Sprintf("#!/bin/sh\nfor a do shift; [ \"$a\" = -Wl,-S ] || set -- \"$@\" \"$a\"; done\n"+
		"exec '%s' -m ziglang cc -target %s \"$@\"\n", strings.ReplaceAll(tc.Python, "'", `'\''`), zigTarget)
	if err := os.WriteFile(tc.CC, []byte(script), 0o755); err != nil {
		return tc, err
	}
	return tc, linkVerbs(tc)
}

// linkVerbs gives the compiler rdma-core's headers and libibverbs without the rest of
// /usr/include and /usr/lib: those hold the build host's glibc headers and libraries, which
// would shadow Zig's 2.28 ones.
func linkVerbs(tc Toolchain) error {
	if _, err := os.Stat(filepath.Join(verbsHeaders, "verbs.h")); err != nil {
		return fmt.Errorf("rdma-core headers missing (%s/verbs.h): apt-get install libibverbs-dev", verbsHeaders)
	}
	soname := ""
	for _, p := range verbsSonames {
		if _, err := os.Stat(p); err == nil {
			soname = p
			break
		}
	}
	if soname == "" {
		return fmt.Errorf("libibverbs.so.1 not found in %v: apt-get install libibverbs1", verbsSonames)
	}
	for _, l := range []struct{ target, link string }{
		{verbsHeaders, filepath.Join(tc.VerbsInclude, "infiniband")},
		{soname, filepath.Join(tc.VerbsLib, "libibverbs.so")},
	} {
		if err := os.MkdirAll(filepath.Dir(l.link), 0o755); err != nil {
			return err
		}
		os.Remove(l.link)
		if err := os.Symlink(l.target, l.link); err != nil {
			return err
		}
	}
	return nil
}

// run runs a command in dir with env added to this process's, its output to log.
func run(log io.Writer, dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// MissingBuildPackages are the Debian packages a development build of the plugin still needs
// (go run mage.go build): a C compiler for cgo and mpib-nettest (without one Go turns cgo off
// and the c-shared build fails on "cgo is not enabled"), and the verbs headers. lookPath and
// stat are exec.LookPath and os.Stat.
func MissingBuildPackages(lookPath func(string) (string, error), stat func(string) (os.FileInfo, error)) []string {
	var pkgs []string
	if _, err := lookPath("gcc"); err != nil {
		pkgs = append(pkgs, "gcc", "libc6-dev")
	}
	if _, err := stat("/usr/include/infiniband/verbs.h"); err != nil {
		pkgs = append(pkgs, "libibverbs-dev", "ibverbs-providers")
	}
	return pkgs
}
