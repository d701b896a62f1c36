// log.go: Go's log lines (warnf, infof), written through NCCL's logger like the C side's
// (mpib_log.c). Every Go file logs through these.

package main

/*
#include <stdlib.h>
#include "mpib_log.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// logf writes through NCCL's logger, one goroutine at a time: the logger takes its own lock
// and writes to a file or pipe, and a goroutine waiting there would hold an OS thread, where
// one waiting on logMu holds none (see Threads in threads.go).
func logf(level C.int, format string, args ...any) {
	msg := C.CString(fmt.Sprintf(format, args...))
	logMu.Lock()
	C.mpib_log_str(level, msg)
	logMu.Unlock()
	C.free(unsafe.Pointer(msg))
}

var logMu sync.Mutex

func warnf(format string, args ...any) { logf(C.NCCL_LOG_WARN, format, args...) }
func infof(format string, args ...any) { logf(C.NCCL_LOG_INFO, format, args...) }
