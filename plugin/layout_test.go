// layout_test.go: checks that keep the package's Go files split by concern (the code map in
// docs/architecture.md): run by go test ./plugin/.

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFileLines is where a file has grown past one concern: split it rather than raise this.
const maxFileLines = 450

// TestFileHeaders: every Go file of the package (plugin.go opens with the package doc instead)
// opens, after its build constraint if any, with a comment that names it and says what it owns
// and who calls it, and none is longer than maxFileLines.
func TestFileHeaders(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in the package directory (%v)", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		if n := len(lines) - 1; n > maxFileLines {
			t.Errorf("%s has %d lines (at most %d): split it by concern", f, n, maxFileLines)
		}
		if f == "plugin.go" || (strings.HasSuffix(f, "_test.go") && f != "layout_test.go") {
			continue
		}
		first := 0
		if strings.HasPrefix(lines[0], "//go:build") {
			first = 2
		}
		if first >= len(lines) || !strings.HasPrefix(lines[first], "// "+f+": ") {
			t.Errorf("%s does not open with a comment %q saying what it owns and who calls it", f, "// "+f+": ")
		}
	}
}
