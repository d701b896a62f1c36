package buildinfo

import (
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"testing"
)

// Line's forms: the stamp as is; without one, the development version and the VCS commit.
func TestLine(t *testing.T) {
	saved := [2]string{version, commit}
	defer func() { version, commit = saved[0], saved[1] }()
	version, commit = "", ""
	vcs := Commit()
	if vcs == "" {
		t.Fatal("an unstamped build names no commit")
	}
	cases := []struct {
		name, version, commit string
		want                  string
	}{
		{"MPIB", "1.2.3+4.gabc", "abc123", "MPIB 1.2.3+4.gabc (commit abc123)"},
		{"mpib-agent", "1.2.3", "def456", "mpib-agent 1.2.3 (commit def456)"},
		{"MPIB", "", "", "MPIB 0.0.0-dev (commit " + vcs + ")"},
		{"mpib-agent", "", "abc", "mpib-agent 0.0.0-dev (commit abc)"},
		{"MPIB", "2.0.0", "", "MPIB 2.0.0 (commit " + vcs + ")"},
	}
	for _, c := range cases {
		version, commit = c.version, c.commit
		if got := Line(c.name); got != c.want {
			t.Errorf("Line(%q) with version %q commit %q = %q, want %q", c.name, c.version, c.commit, got, c.want)
		}
	}
}

func TestVCSCommit(t *testing.T) {
	cases := []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{nil, "unknown"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}, "abc"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}, {Key: "vcs.modified", Value: "true"}}, "abc-dirty"},
		{[]debug.BuildSetting{{Key: "vcs.modified", Value: "false"}, {Key: "vcs.revision", Value: "abc"}}, "abc"},
		{[]debug.BuildSetting{{Key: "vcs.modified", Value: "true"}}, "unknown-dirty"},
	}
	for _, c := range cases {
		if got := vcsCommit(c.settings); got != c.want {
			t.Errorf("vcsCommit(%v) = %q, want %q", c.settings, got, c.want)
		}
	}
}

// LDFlags must name this package's variables: a binary built with them prints the stamp.
func TestLDFlagsStamp(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds a binary with go build")
	}
	bin := filepath.Join(t.TempDir(), "stamped")
	build := exec.Command("go", "build", "-ldflags", LDFlags("9.8.7-rc1", "f00d"), "-o", bin, "./testdata/stamped")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if want := "stamped 9.8.7-rc1 (commit f00d)\n"; err != nil || string(out) != want {
		t.Fatalf("the stamped binary printed %q (%v), want %q", out, err, want)
	}
}
