//go:build !linux

package shm

import "fmt"

// Segment is only available on Linux; Decode/Encode/Resolve work everywhere.
type Segment struct{}

// Now is unsupported off Linux and returns 0.
func Now() uint64 { return 0 }

// Create is unsupported off Linux.
func Create(path string, nslots, npeers uint32, force bool) (*Segment, error) {
	return nil, fmt.Errorf("create %s: %w", path, ErrNotSupported)
}

// Open is unsupported off Linux.
func Open(path string) (*Segment, error) {
	return nil, fmt.Errorf("open %s: %w", path, ErrNotSupported)
}
