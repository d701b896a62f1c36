package main

import "testing"

// The release's stamp is what --version prints; without one the line still names a version
// and a commit, never an empty field.
func TestVersionLine(t *testing.T) {
	saved := [2]string{buildVersion, buildCommit}
	defer func() { buildVersion, buildCommit = saved[0], saved[1] }()
	buildVersion, buildCommit = "1.2.3+4.gabc", "abc123"
	if got, want := versionLine(), "mpib-agent 1.2.3+4.gabc (commit abc123)"; got != want {
		t.Fatalf("stamped: %q, want %q", got, want)
	}
	buildVersion, buildCommit = "", ""
	got := versionLine()
	if got == "mpib-agent 0.0.0-dev (commit )" || len(got) <= len("mpib-agent 0.0.0-dev (commit )") {
		t.Fatalf("unstamped: %q names no commit", got)
	}
}
