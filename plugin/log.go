// log.go: Go's log lines (warnf, infof), written through NCCL's logger like the C side's
// (mpib_log.c), and burstLog, the limit on lines a peer can cause at will. Every Go file logs
// through these.

package main

/*
#include <stdlib.h>
#include "mpib_log.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"
)

// logf writes through NCCL's logger, one goroutine at a time: the logger takes its own lock
// and writes to a file or pipe, and a goroutine waiting there would hold an OS thread, where
// one waiting on logMu holds none (see Threads in threads.go).
func logf(level C.int, format string, args ...any) {
	text := fmt.Sprintf(format, args...)
	msg := C.CString(text)
	logMu.Lock()
	if logTap != nil {
		logTap(level == C.NCCL_LOG_WARN, text)
	} else {
		C.mpib_log_str(level, msg)
	}
	logMu.Unlock()
	C.free(unsafe.Pointer(msg))
}

var logMu sync.Mutex

// logTap, when set (by a test, under logMu), takes every line instead of NCCL's logger.
var logTap func(warn bool, line string)

func warnf(format string, args ...any) { logf(C.NCCL_LOG_WARN, format, args...) }
func infof(format string, args ...any) { logf(C.NCCL_LOG_INFO, format, args...) }

// burstLog limits a kind of line that a peer (or a flood of TCP clients) can cause at will, so
// that it cannot flood NCCL's log: the first event of a burst is said, then at most one line a
// second, with the count of events since the last line.
type burstLog struct {
	mu     sync.Mutex
	last   time.Time // when a line was last due
	unseen int       // events since then
	total  uint64
}

// note counts one event at now and says whether a line is due: n is how many events it stands
// for (1: this one alone), 0 when none is; total counts every event so far.
func (b *burstLog) note(now time.Time) (n int, total uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total++
	b.unseen++
	if now.Sub(b.last) < time.Second {
		return 0, b.total
	}
	n, b.unseen, b.last = b.unseen, 0, now
	return n, b.total
}
