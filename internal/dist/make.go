package dist

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config says what the release is built from and where.
type Config struct {
	Root   string    // the repository's root
	Out    string    // emptied, then holds the tarball, the .deb and SHA256SUMS (build/dist)
	Tools  string    // the tools venv, kept between builds (build/venv-dist)
	Python string    // the interpreter that creates Tools
	Log    io.Writer // the commands' output
}

// Release is what Make built.
type Release struct {
	Version, Commit string
	Python          string // Version in PEP 440's form: the Python agent's wheel and sdist carry it
	Tarball, Deb    string // paths under Config.Out
	Needs           []Need // of the shipped ELF files
}

// Binaries are the release tree's ELF files, checked against Baseline.
var Binaries = []string{"lib/libnccl-net-mpib.so", "bin/mpib-agent", "bin/mpib-nettest"}

// Make builds the release: the binaries for Baseline (refusing any that needs more), the
// Python agent's wheel and sdist (versioned as the release, in PEP 440's form), the docs, the plugin's .deb and SHA256SUMS, in
// Out/mpib-VERSION-linux-x86_64.tar.gz; the .deb and a SHA256SUMS of both also lie in Out.
func Make(c Config) (Release, error) {
	root, err := filepath.Abs(c.Root)
	if err != nil {
		return Release{}, err
	}
	c.Root = root
	rel, epoch, err := gitVersion(root)
	if err != nil {
		return rel, err
	}
	if rel.Python, err = PythonVersion(rel.Version); err != nil {
		return rel, err
	}
	tc, err := SetupToolchain(c.Tools, c.Python, c.Log)
	if err != nil {
		return rel, err
	}
	name := "mpib-" + rel.Version + "-linux-x86_64"
	stage := filepath.Join(c.Out, name)
	if err := os.RemoveAll(c.Out); err != nil {
		return rel, err
	}
	for _, d := range []string{"lib", "bin", "python", "docs", "deb"} {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return rel, err
		}
	}
	if err := buildBinaries(c, tc, rel, stage); err != nil {
		return rel, err
	}
	if rel.Needs, err = checkStage(stage); err != nil {
		return rel, err
	}
	env := []string{"SOURCE_DATE_EPOCH=" + strconv.FormatInt(epoch.Unix(), 10)}
	if err := buildPython(c, tc, env, rel, filepath.Join(stage, "python")); err != nil {
		return rel, err
	}
	if err := copyDocs(c.Root, stage, rel); err != nil {
		return rel, err
	}
	if rel.Deb, err = buildDeb(c, env, rel, stage); err != nil {
		return rel, err
	}
	return rel, pack(c, stage, name, epoch, &rel)
}

// gitVersion reads the release version and commit of the work tree at root, and the commit's
// time (the archives' timestamps).
func gitVersion(root string) (Release, time.Time, error) {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	var rel Release
	describe, err := git("describe", "--tags", "--always", "--dirty", "--abbrev=12")
	if err != nil {
		return rel, time.Time{}, err
	}
	if rel.Version, err = ReleaseVersion(describe); err != nil {
		return rel, time.Time{}, err
	}
	if rel.Commit, err = git("rev-parse", "HEAD"); err != nil {
		return rel, time.Time{}, err
	}
	ct, err := git("log", "-1", "--format=%ct")
	if err != nil {
		return rel, time.Time{}, err
	}
	sec, err := strconv.ParseInt(ct, 10, 64)
	if err != nil {
		return rel, time.Time{}, fmt.Errorf("git log: commit time %q: %w", ct, err)
	}
	return rel, time.Unix(sec, 0).UTC(), nil
}

// checkStage reads the staged binaries' needs and refuses any beyond Baseline.
func checkStage(stage string) ([]Need, error) {
	var all []Need
	for _, b := range Binaries {
		f, err := os.Open(filepath.Join(stage, b))
		if err != nil {
			return nil, err
		}
		needs, err := ReadNeeds(b, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		all = append(all, needs...)
	}
	bad, err := Violations(all, Baseline)
	if err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("the release would not load on glibc %s:\n  %s", Baseline.Glibc, strings.Join(bad, "\n  "))
	}
	return all, nil
}
