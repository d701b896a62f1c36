//go:build mage

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/magefile/mage/mg"
	"github.com/magefile/mage/sh"
)

// Agent groups the policy agents: the static Go CLI and the Python package.
type Agent mg.Namespace

// agentVenv is the virtual environment Agent:Test installs the Python package into.
var agentVenv = filepath.Join(buildDir, "venv")

// Build builds build/mpib-agent (static, CGO_ENABLED=0) and copies the Python package to
// build/python (lab nodes: PYTHONPATH=<build>/python/src python3 -m mpib_agent ...).
func (Agent) Build() error {
	if err := os.MkdirAll(buildDir, 0o755); err != nil {
		return err
	}
	err := sh.RunWith(map[string]string{"CGO_ENABLED": "0"}, "go", "build", "-trimpath",
		"-ldflags", "-s -w", "-o", filepath.Join(buildDir, "mpib-agent"), "./agent/go/cmd/mpib-agent")
	if err != nil {
		return err
	}
	dst := filepath.Join(buildDir, "python")
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	for _, f := range []string{"pyproject.toml", "README.md", "src"} {
		if err := copyTree(filepath.Join("agent", "python", f), filepath.Join(dst, f)); err != nil {
			return err
		}
	}
	return nil
}

// Test fuzzes the segment decoders briefly (Agent.Fuzz), installs the Python package into
// build/venv (pip, from agent/python) and runs pytest.
func (Agent) Test() error {
	mg.Deps(Agent.Fuzz)
	py := filepath.Join(agentVenv, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		if err := sh.Run("python3", "-m", "venv", agentVenv); err != nil {
			return err
		}
	}
	if err := sh.Run(py, "-m", "pip", "install", "-q", "pytest"); err != nil {
		return err
	}
	if err := sh.Run(py, "-m", "pip", "install", "-q", "./agent/python[gym,plot]"); err != nil { // pip reinstalls a local project each time; gymnasium, numpy, matplotlib (about 17 s from PyPI, wheels) only when missing
		return err
	}
	return sh.RunV(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "agent/python/tests")
}

// fuzzTargets are the decoders of what another party can write: the segment (the C reader the
// plugin runs, through a cgo shim and compared with the Go decoder, and the Go agent's decoder)
// and the control connection's wire messages (handle, hello, metadata, ack: whatever a TCP
// client or peer rank sends). `go test` runs their seed corpora (testdata/shm and each
// package's testdata/fuzz); Fuzz adds a few seconds of new inputs.
var fuzzTargets = []struct{ name, pkg string }{
	{"FuzzCReader", "./plugin/ctest/shmfuzz"},
	{"FuzzDecode", "./agent/go/shm"},
	{"FuzzDecodeHandle", "./plugin/internal/wire"},
	{"FuzzDecodeHello", "./plugin/internal/wire"},
	{"FuzzDecodeMetadata", "./plugin/internal/wire"},
	{"FuzzCheckAck", "./plugin/internal/wire"},
}

// Fuzz runs each fuzzer for a fixed number of executions (60000 for the segment decoders, a few
// seconds each on an idle 2-core host; 100000 for the tiny wire decoders, about 3 s), or for MPIB_FUZZTIME
// (any -fuzztime value) when set. A count, not a duration, on purpose: with a duration Go 1.26's
// fuzz coordinator can report its own deadline as "context deadline exceeded" and fail a run
// that found nothing (go.dev/issue/75804, fixed in Go 1.27). A count never arms that deadline; a slow host only makes the run longer.
func (Agent) Fuzz() error {
	override := os.Getenv("MPIB_FUZZTIME")
	for _, f := range fuzzTargets {
		ft := "60000x"
		if strings.HasSuffix(f.pkg, "/wire") {
			ft = "100000x"
		}
		if override != "" {
			ft = override
		}
		if err := sh.RunV("go", "test", "-run", "^$", "-fuzz", "^"+f.name+"$", "-fuzztime", ft,
			"-fuzzminimizetime", "1s", f.pkg); err != nil {
			return err
		}
	}
	return nil
}

// copyTree copies a file or directory, skipping Python caches.
func copyTree(src, dst string) error {
	return filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if strings.Contains(p, "__pycache__") || strings.HasSuffix(p, ".egg-info") {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		w, err := os.OpenFile(out, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, in); err != nil {
			w.Close()
			return err
		}
		return w.Close()
	})
}
