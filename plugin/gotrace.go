// gotrace.go: the Go runtime's execution trace of the control plane (MPIB_GO_TRACE), for
// `go tool trace`: the handshakes' goroutines, what woke each of them, their syscalls and cgo
// calls, and the runtime's threads. Where a connection setup spends its time beyond the verbs
// calls is there and nowhere else (docs/benchmarks.md). Off unless the variable is set; the
// data path is C and never appears in it.

package main

import (
	"fmt"
	"os"
	"runtime/trace"
	"sync"
	"time"
)

// goTracer is the process's one execution trace: the first init with MPIB_GO_TRACE starts it,
// and it stops after its time or at the last finalize, whichever comes first.
var goTracer struct {
	mu      sync.Mutex
	started bool // once per process: a later init (after the last finalize) starts none
	file    *os.File
	path    string
	timer   *time.Timer
}

// startGoTrace starts the trace into prefix.PID.trace for `seconds` and returns the file's
// path; "" and nil when prefix is "" or a trace was started before. A file that exists is
// not overwritten: the error names it.
func startGoTrace(prefix string, seconds int) (string, error) {
	goTracer.mu.Lock()
	defer goTracer.mu.Unlock()
	if prefix == "" || goTracer.started {
		return "", nil
	}
	goTracer.started = true
	path := fmt.Sprintf("%s.%d.trace", prefix, os.Getpid())
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", fmt.Errorf("MPIB_GO_TRACE: %w", err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		os.Remove(path)
		return "", fmt.Errorf("MPIB_GO_TRACE: %s: %w", path, err)
	}
	goTracer.file, goTracer.path = f, path
	goTracer.timer = time.AfterFunc(time.Duration(seconds)*time.Second, stopGoTrace)
	return path, nil
}

// stopGoTrace ends a trace under way and closes its file; it does nothing otherwise.
func stopGoTrace() {
	goTracer.mu.Lock()
	defer goTracer.mu.Unlock()
	if goTracer.file == nil {
		return
	}
	goTracer.timer.Stop()
	trace.Stop()
	if err := goTracer.file.Close(); err != nil {
		warnf("MPIB_GO_TRACE: %s: %v", goTracer.path, err)
	} else {
		infof("MPIB_GO_TRACE: the control plane's trace is in %s (go tool trace %s)", goTracer.path, goTracer.path)
	}
	goTracer.file = nil
}
