//go:build mage

// MPIB build targets. `go run mage.go -l` lists them.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/magefile/mage/mg"
	"github.com/magefile/mage/sh"
	"github.com/mpib/mpib/internal/dist"
	"github.com/mpib/mpib/internal/lab"
)

// Aliases: `go run mage.go test` runs every test, the lab integration suite included.
var Aliases = map[string]interface{}{
	"test": Test.All,
}

// buildDir holds every artifact the lab shares into its nodes.
const buildDir = "build"

// Test groups the test targets.
type Test mg.Namespace

// All runs Lint, then the unit tests and then the lab integration suite (the README's test
// command); a lint failure stops it before anything is built.
// The lab VM boots while the Go and C unit tests run (on a cold machine its image is built
// first: package downloads and a first boot, about 3 minutes of mostly waiting), so the suite
// finds it running; All powers off a VM it booted. The agents' fuzzers and the Python tests
// run after the boot, not beside it: a booting VM takes both cores and starves them. A
// boot that fails here is not an error yet: the suite boots the lab itself and reports what
// goes wrong.
func (Test) All(ctx context.Context) error {
	mg.Deps(Lint)
	var env *lab.Env
	booted := make(chan struct{})
	go func() {
		defer close(booted)
		cfg, err := labConfig()
		if err == nil {
			env, err = lab.Up(ctx, cfg)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "lab: booting beside the unit tests failed (the suite tries again): %v\n", err)
		}
	}()
	defer func() { // also when a failed dependency unwinds this target (mg.Deps panics)
		<-booted
		if env != nil && env.Owned {
			Lab{}.Down(context.WithoutCancel(ctx))
		}
	}()
	unitErr := unitGoAndC()
	<-booted
	if unitErr != nil {
		return unitErr
	}
	mg.Deps(Agent.Test)
	return Test{}.Integration()
}

// Unit runs the fast tests: Go packages outside integration/, the release check (after Dist),
// the C tests and the Python agent tests.
func (Test) Unit() error {
	if err := unitGoAndC(); err != nil {
		return err
	}
	mg.Deps(Agent.Test)
	return nil
}

// unitGoAndC runs the Go packages' tests outside integration/, then the release check and the
// C tests alone and verbose: they print evidence lines (dist:, replay-model:, flush:, ...)
// that go test shows only for a package it tests alone with -v. The release is built first
// (Dist) so that the check reads it.
func unitGoAndC() error {
	mg.SerialDeps(Build, Dist)
	pkgs, err := unitPackages()
	if err != nil {
		return err
	}
	var goPkgs []string
	for _, p := range pkgs {
		if !strings.HasSuffix(p, cTestPackage) && !strings.HasSuffix(p, distPackage) {
			goPkgs = append(goPkgs, p)
		}
	}
	if err := sh.RunV("go", append([]string{"test", "-count=1"}, goPkgs...)...); err != nil {
		return err
	}
	if err := sh.RunV("go", "test", "-count=1", "-v", "."+distPackage); err != nil {
		return err
	}
	return sh.RunV("go", "test", "-count=1", "-v", "."+cTestPackage)
}

// distPackage is the release's package (its path's tail): its tests check build/dist.
const distPackage = "/internal/dist"

// Dist builds the release for glibc 2.28 (RHEL 8) and newer: build/dist/mpib-VERSION-linux-x86_64.tar.gz
// (the plugin, mpib-agent, mpib-nettest, the Python agent's wheel and sdist, the docs, the
// plugin's .deb, SHA256SUMS), the .deb beside it, and a SHA256SUMS of both. The C toolchain
// is Zig's, from PyPI, in build/venv-dist (docs/deploying.md, "Installing a release").
func Dist() error {
	if err := ensureBuildDeps(); err != nil {
		return err
	}
	start := time.Now()
	rel, err := dist.Make(dist.Config{Root: ".", Out: filepath.Join(buildDir, "dist"),
		Tools: filepath.Join(buildDir, "venv-dist"), Python: "python3", Log: os.Stdout})
	if err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	fmt.Printf("dist-build: version=%s commit=%s tarball=%s deb=%s seconds=%.0f\n",
		rel.Version, rel.Commit, rel.Tarball, rel.Deb, time.Since(start).Seconds())
	return nil
}

// cTestPackage is the C tests' runner package (its path's tail).
const cTestPackage = "/plugin/ctest"

// Integration runs the soft-RoCE lab suite (builds and boots the lab on demand). It names the
// lab package alone: `go test` streams a package's output as it runs only when it tests one
// package, and holds all of it until the end otherwise (the lab lines of a 25-minute suite).
// The lab's helper packages, which need no lab (integration/kv, benchstat, closedloop,
// leakstat, scalestat, perftest, callgrind, and the layering check), run with the unit tests.
func (Test) Integration() error {
	mg.Deps(Build, buildHostileTestPlugin)
	return sh.RunV("go", "test", "-count=1", "-v", "-timeout", "80m", labPackage)
}

// labPackage is the lab integration suite's package.
const labPackage = "./integration/"

// Faults runs the lab's fault-injection and leak suites (docs/failover.md): rails cut,
// black-holed, lossy, flapping and deleted under verified transfers, errors where no rail is
// left (these two also run in every lab suite, checked there against wider bounds), and
// 200 connect/close and 20 failover/recovery cycles (these also run in every lab suite),
// all checked against the failover targets of docs/failover.md (MPIB_FAULTS=1; about 12 minutes).
func (Test) Faults() error {
	mg.Deps(Build)
	env := map[string]string{"MPIB_FAULTS": "1"}
	return sh.RunWithV(env, "go", "test", "-count=1", "-v", "-timeout", "60m", "-run", "^Test(Fault|Leak)", "./integration/")
}

// unitPackages lists every package except the lab suite.
func unitPackages() ([]string, error) {
	out, err := sh.Output("go", "list", "./...")
	if err != nil {
		return nil, err
	}
	lab, err := sh.Output("go", "list", labPackage)
	if err != nil {
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(out) {
		if p != strings.TrimSpace(lab) {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// Build produces build/libnccl-net-mpib.so and the helper binaries the lab uses.
func Build() error {
	mg.Deps(Agent.Build)
	if err := ensureBuildDeps(); err != nil {
		return err
	}
	if err := os.MkdirAll(buildDir, 0o755); err != nil {
		return err
	}
	if err := buildPlugin(); err != nil {
		return err
	}
	return buildNettest()
}

// buildNettest builds the C test driver that loads the plugin exactly as NCCL's proxy does.
func buildNettest() error {
	srcs, err := filepath.Glob("plugin/nettest/*.c")
	if err != nil || len(srcs) == 0 {
		return fmt.Errorf("no nettest sources in plugin/nettest: %v", err)
	}
	args := append([]string{"-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-Iplugin",
		"-o", filepath.Join(buildDir, "mpib-nettest")}, srcs...)
	return sh.RunV("gcc", append(args, "-ldl", "-lpthread", "-lm")...)
}

// buildPlugin builds the c-shared plugin with a version script exporting only ncclNetPlugin_v*.
// The static symbol table stays (no -s) so that gdb, perf and callgrind name the data-path
// functions in a user's NCCL process; -w drops only the DWARF, most of the size.
func buildPlugin() error {
	script, err := filepath.Abs("plugin/exports.map")
	if err != nil {
		return err
	}
	ldflags := "-w -extldflags=-Wl,--version-script=" + script
	// A build before the hostile test build moved to testOnlyDir left it beside the product.
	os.Remove(filepath.Join(buildDir, "libnccl-net-mpib-hostile.so"))
	return sh.RunV("go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags", ldflags,
		"-o", filepath.Join(buildDir, "libnccl-net-mpib.so"), "./plugin")
}

// testOnlyDir holds what only the lab suite loads, never copied to a host that runs NCCL. It
// sits under buildDir because the lab shares buildDir (alone) into its nodes.
var testOnlyDir = filepath.Join(buildDir, "test-only")

// hostileTestPlugin is the hostile test build's file name: the plugin with test-only
// misbehaviour (a forced Go panic, a sender that attacks its receiver) that MPIB_TEST_HOSTILE
// turns on (plugin/hostile_on.go, plugin/mpib_hostile.c). integration/hostile_test.go names
// the same path.
const hostileTestPlugin = "libnccl-net-mpib-hostile-test-only.so"

// buildHostileTestPlugin builds the hostile test build for the lab's hostile-input tests
// (test:integration and test, never build).
func buildHostileTestPlugin() error {
	mg.Deps(Build)
	script, err := filepath.Abs("plugin/exports.map")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(testOnlyDir, 0o755); err != nil {
		return err
	}
	ldflags := "-w -extldflags=-Wl,--version-script=" + script
	return sh.RunV("go", "build", "-buildmode=c-shared", "-trimpath", "-tags", "mpibhostile", "-ldflags", ldflags,
		"-o", filepath.Join(testOnlyDir, hostileTestPlugin), "./plugin")
}

// ensureBuildDeps installs what the build needs and is missing (a C compiler, the verbs
// headers) as root, or names it.
func ensureBuildDeps() error {
	pkgs := dist.MissingBuildPackages(exec.LookPath, os.Stat)
	if len(pkgs) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("the build needs %s: install them (apt-get install %s) or run as root", strings.Join(pkgs, ", "),
			strings.Join(pkgs, " "))
	}
	return aptInstall(pkgs...)
}

// aptInstall installs Debian packages non-interactively.
func aptInstall(pkgs ...string) error {
	fmt.Println("installing:", strings.Join(pkgs, " "))
	if err := sh.Run("apt-get", "update", "-qq"); err != nil {
		return err
	}
	cmd := exec.Command("apt-get", append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

// Bench runs the failover model checker over a million schedules (plugin/ctest/model_test.go,
// two processes: about 5 minutes) and the send path's instruction count on fake verbs
// (plugin/ctest/hotpath_test.go: its hotpath: lines, a few seconds), then the plugin against
// perftest on the same soft-RoCE rails (P1..P5) and on the SUP mesh (mesh-bw); it prints one
// line per figure and writes docs/benchmarks.md's table and docs/benchmarks.png.
// MPIB_BENCH_MODEL=0 skips the checker. MPIB_NETIB_REF_SRC, a checkout of
// github.com/Mellanox/nccl-rdma-sharp-plugins, builds net_ib's port from it
// (scripts/build_netib_ref.sh), which the connection setup, memory and P4 benchmarks then
// measure beside MPIB.
func Bench() error {
	mg.Deps(Build)
	if src := os.Getenv("MPIB_NETIB_REF_SRC"); src != "" {
		if err := sh.RunV("bash", "scripts/build_netib_ref.sh", src, filepath.Join(buildDir, "libnccl-net-netib-ref.so")); err != nil {
			return err
		}
	}
	if err := sh.RunV("go", "test", "-count=1", "-v", "-run", "^TestHotPathInstructions$", "."+cTestPackage); err != nil {
		return err
	}
	if os.Getenv("MPIB_BENCH_MODEL") != "0" {
		env := map[string]string{"MPIB_MODEL_SCHEDULES": "1000000", "MPIB_MODEL_SHARDS": "2", "MPIB_MODEL_SECONDS": "1"}
		if err := sh.RunWithV(env, "go", "test", "-count=1", "-v", "-timeout", "60m", "-run", "^TestFailoverModel$", "."+cTestPackage); err != nil {
			return err
		}
	}
	out, err := filepath.Abs(filepath.Join(buildDir, "bench"))
	if err != nil {
		return err
	}
	os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	env := map[string]string{"MPIB_BENCH": "1", "MPIB_BENCH_OUT": out}
	if err := sh.RunWithV(env, "go", "test", "-count=1", "-v", "-timeout", "90m", "-run", "TestBench", "./integration/"); err != nil {
		return err
	}
	py, err := toolsPython("matplotlib")
	if err != nil {
		return err
	}
	return sh.RunV(py, "scripts/bench_report.py", out, "docs/benchmarks.md")
}

// toolsPython returns the interpreter of build/venv-tools with the given packages installed
// (plotting for bench and demo; the agent itself needs none).
func toolsPython(pkgs ...string) (string, error) {
	return venvPython(filepath.Join(buildDir, "venv-tools"), pkgs...)
}

// venvPython returns the interpreter of the virtual environment venv, created when missing
// (as root it installs python3-venv first where Debian's python3 lacks it), with the given
// packages installed from PyPI (pip skips those already installed).
func venvPython(venv string, pkgs ...string) (string, error) {
	py := filepath.Join(venv, "bin", "python3")
	if _, err := os.Stat(py); err != nil {
		if err := sh.Run("python3", "-m", "venv", venv); err != nil {
			if os.Geteuid() != 0 {
				return "", fmt.Errorf("creating %s (apt-get install python3-venv): %w", venv, err)
			}
			os.RemoveAll(venv) // a venv made without ensurepip has no pip
			if err := aptInstall("python3-venv"); err != nil {
				return "", err
			}
			if err := sh.Run("python3", "-m", "venv", venv); err != nil {
				return "", fmt.Errorf("creating %s: %w", venv, err)
			}
		}
	}
	args := append([]string{"-m", "pip", "install", "-q", "--disable-pip-version-check"}, pkgs...)
	return py, sh.Run(py, args...)
}

// Demo boots the two-island soft-RoCE lab and runs traffic between the islands in vanilla
// mode, then in advanced mode with the Go agent moving the split live, then cuts a1's SUP
// link under traffic and brings it back (the failover and the return); per-rail throughput
// is printed every second and charted in build/demo/demo.png.
func Demo() error {
	mg.Deps(Build)
	out, err := filepath.Abs(filepath.Join(buildDir, "demo"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	env := map[string]string{"MPIB_DEMO": "1", "MPIB_DEMO_OUT": out}
	if err := sh.RunWithV(env, "go", "test", "-count=1", "-v", "-timeout", "40m", "-run", "^TestDemo$", "./integration/"); err != nil {
		return err
	}
	py, err := toolsPython("matplotlib")
	if err != nil {
		return err
	}
	return sh.RunV(py, "scripts/demo_chart.py", filepath.Join(out, "timeline.json"), filepath.Join(out, "demo.png"))
}
