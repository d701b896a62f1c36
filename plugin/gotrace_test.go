package main

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestGoTrace starts the execution trace, runs goroutines into it, stops it, and reads a
// trace file back; a second start in the process does nothing, and an existing file is never
// overwritten.
func TestGoTrace(t *testing.T) {
	prefix := filepath.Join(t.TempDir(), "mpib")
	if path, err := startGoTrace("", 10); path != "" || err != nil {
		t.Fatalf("no prefix: %q %v, want nothing", path, err)
	}
	path, err := startGoTrace(prefix, 10)
	if err != nil || !strings.HasPrefix(path, prefix+".") || !strings.HasSuffix(path, ".trace") {
		t.Fatalf("startGoTrace: %q %v", path, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done() }()
	}
	wg.Wait()
	if again, err := startGoTrace(prefix+"-again", 10); again != "" || err != nil {
		t.Fatalf("a second trace: %q %v, want none", again, err)
	}
	stopGoTrace()
	stopGoTrace() // the timer or a later finalize may come again
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 64 || !strings.HasPrefix(string(b), "go 1.") {
		t.Fatalf("trace file %s: %d bytes, %v (want a Go execution trace)", path, len(b), err)
	}

	goTracer.started = false // a new process: the file exists, so it is refused
	if _, err := startGoTrace(prefix, 10); err == nil || !strings.Contains(err.Error(), "file exists") {
		t.Fatalf("an existing file: %v, want it refused", err)
	}
	goTracer.started = true
}
