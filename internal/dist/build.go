package dist

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/mpib/mpib/internal/buildinfo"
)

// buildBinaries builds the plugin and mpib-nettest with the Zig toolchain (cgo, and with it the
// Go runtime's C, compiled for glibc 2.28) and mpib-agent without cgo (static), into the
// stage's lib/ and bin/. The plugin and the agent carry the version and commit.
func buildBinaries(c Config, tc Toolchain, rel Release, stage string) error {
	script := filepath.Join(c.Root, "plugin", "exports.map")
	if strings.ContainsAny(script, " \t'\"") {
		return fmt.Errorf("the repository path %q holds a space or quote: -extldflags cannot carry it", c.Root)
	}
	stamp := buildinfo.LDFlags(rel.Version, rel.Commit)
	cgoEnv := []string{"CGO_ENABLED=1", "GOOS=linux", "GOARCH=amd64", "CC=" + tc.CC,
		"CGO_CFLAGS=-O2 -I" + tc.VerbsInclude, "CGO_LDFLAGS=-O2 -L" + tc.VerbsLib}
	so := filepath.Join(stage, "lib", "libnccl-net-mpib.so")
	if err := run(c.Log, c.Root, cgoEnv, "go", "build", "-buildmode=c-shared", "-trimpath",
		"-ldflags", stamp+" -w -extldflags=-Wl,--version-script="+script, "-o", so, "./plugin"); err != nil {
		return err
	}
	os.Remove(strings.TrimSuffix(so, ".so") + ".h") // cgo's export header: NCCL uses its own ABI headers
	if err := buildNettest(c, tc, filepath.Join(stage, "bin", "mpib-nettest")); err != nil {
		return err
	}
	return run(c.Log, c.Root, []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}, "go", "build", "-trimpath",
		"-ldflags", stamp+" -s -w", "-o", filepath.Join(stage, "bin", "mpib-agent"), "./agent/go/cmd/mpib-agent")
}

// buildNettest compiles plugin/nettest as magefile's buildNettest does, plus the mallinfo2
// shim that glibc 2.28 needs (packaging/glibc-2.28/mallinfo2.c says how it works).
func buildNettest(c Config, tc Toolchain, out string) error {
	srcs, err := filepath.Glob(filepath.Join(c.Root, "plugin", "nettest", "*.c"))
	if err != nil || len(srcs) == 0 {
		return fmt.Errorf("no nettest sources in plugin/nettest: %v", err)
	}
	srcs = append(srcs, filepath.Join(c.Root, "packaging", "glibc-2.28", "mallinfo2.c"))
	args := append([]string{"-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-Iplugin",
		"-Dmallinfo2=mpib_compat_mallinfo2", "-o", out}, srcs...)
	return run(c.Log, c.Root, nil, tc.CC, append(args, "-ldl", "-lpthread", "-lm")...)
}

// buildPython builds agent/python's wheel and sdist into dst with PyPA's build, which installs
// whatever backend the pyproject names into an isolated environment (from PyPI). They are built
// from a copy that names the release's version in Python's form (stagePython).
func buildPython(c Config, tc Toolchain, env []string, rel Release, dst string) error {
	abs, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	src, err := stagePython(c.Root, rel.Python)
	if err != nil {
		return err
	}
	defer os.RemoveAll(src)
	return run(c.Log, c.Root, env, tc.Python, "-m", "build", "--sdist", "--wheel", "--outdir", abs, src)
}

// releaseDocs are copied into the release's docs/ (every file of docs/ besides).
var releaseDocs = []string{"README.md"}

// releaseScripts are the scripts docs/deploying.md has an operator run, copied into the
// release's scripts/.
var releaseScripts = []string{"scripts/launch_nccl.sh", "scripts/nccl_load_check.py"}

// copyDocs copies docs/ and the README into the stage's docs/ and the operator's scripts into
// its scripts/, and writes VERSION.
func copyDocs(root, stage string, rel Release) error {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*"))
	if err != nil {
		return err
	}
	for _, f := range releaseDocs {
		docs = append(docs, filepath.Join(root, f))
	}
	for _, src := range docs {
		if st, err := os.Stat(src); err != nil || !st.Mode().IsRegular() {
			continue // a folder under docs/: not part of the release
		}
		if err := copyFile(src, filepath.Join(stage, "docs", filepath.Base(src)), 0o644); err != nil {
			return err
		}
	}
	for _, f := range releaseScripts {
		if err := copyFile(filepath.Join(root, f), filepath.Join(stage, f), 0o755); err != nil {
			return err
		}
	}
	v := fmt.Sprintf("%s\ncommit %s\n", rel.Version, rel.Commit)
	return os.WriteFile(filepath.Join(stage, "VERSION"), []byte(v), 0o644)
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		return err
	}
	return os.Chmod(dst, mode) // WriteFile keeps an existing file's mode, and the umask applies
}
