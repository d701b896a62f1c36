//go:build !linux

package shm

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// Segment is only available on Linux; Decode/Encode/Resolve work everywhere.
type Segment struct{}

// Now is unsupported off Linux and returns 0.
func Now() uint64 { return 0 }

// DefaultPath is $MPIB_SHM_PATH, else /dev/shm/mpib-hints-EUID.
func DefaultPath() string {
	if p := os.Getenv("MPIB_SHM_PATH"); p != "" {
		return p
	}
	return DefaultPathPrefix + strconv.Itoa(os.Geteuid())
}

// StaleFromEnv is the default staleness limit off Linux.
func StaleFromEnv() time.Duration { return DefaultStaleMs * time.Millisecond }

// BeatPeriod is stale/4.
func BeatPeriod(stale time.Duration) time.Duration { return max(stale/4, time.Millisecond) }

// Create is unsupported off Linux.
func Create(path string, nslots, npeers uint32, force bool) (*Segment, error) {
	return nil, fmt.Errorf("create %s: %w", path, ErrNotSupported)
}

// Open is unsupported off Linux.
func Open(path string) (*Segment, error) {
	return nil, fmt.Errorf("open %s: %w", path, ErrNotSupported)
}
