package main

import (
	"strings"
	"testing"

	"github.com/mpib/mpib/internal/buildinfo"
)

// --version names the program, then buildinfo's version and commit (internal/buildinfo's
// tests cover the stamped and unstamped forms), never an empty field.
func TestVersionLine(t *testing.T) {
	want := "mpib-agent " + buildinfo.Version() + " (commit " + buildinfo.Commit() + ")"
	if got := versionLine(); got != want {
		t.Fatalf("versionLine() = %q, want %q", got, want)
	}
	if strings.Contains(want, "  ") || strings.HasSuffix(want, "(commit )") {
		t.Fatalf("versionLine() = %q has an empty field", want)
	}
}
