package shm

import (
	"errors"
	"fmt"
)

// Validation sentinels; the names match the codes of the spec's validation table.
var (
	ErrNotRegular  = errors.New("not_regular")
	ErrBadOwner    = errors.New("bad_owner")
	ErrBadMode     = errors.New("bad_mode")
	ErrTooSmall    = errors.New("too_small")
	ErrBadMagic    = errors.New("bad_magic")
	ErrBadVersion  = errors.New("bad_version")
	ErrBadGeometry = errors.New("bad_geometry")
)

// Operation sentinels.
var (
	ErrHintClamped   = errors.New("hint clamped to 1024")
	ErrSlotRange     = errors.New("slot index out of range")
	ErrSlotInactive  = errors.New("slot not active")
	ErrPeerTableFull = errors.New("peer table full")
	ErrSlotsFull     = errors.New("no free slot")
	ErrBusy          = errors.New("record busy (seqlock)")
	ErrBadClass      = errors.New("path class must be 0 (intra) or 1 (inter)")
	ErrBadPrefix     = errors.New("prefix length must be 0..32")
	ErrNotSupported  = errors.New("not supported on this platform")
)

// ValidationError says why a segment was refused. errors.Is matches its Code sentinel.
type ValidationError struct {
	Path   string // "" for a byte image
	Code   error  // one of the validation sentinels
	Detail string
}

func (e *ValidationError) Error() string {
	p := e.Path
	if p == "" {
		p = "(buffer)"
	}
	return fmt.Sprintf("mpib shm %s: %v: %s", p, e.Code, e.Detail)
}

func (e *ValidationError) Unwrap() error { return e.Code }

// Code returns the spec's code for err ("bad_magic", ...), or "" when err is not a
// validation failure.
func Code(err error) string {
	for _, s := range []error{ErrNotRegular, ErrBadOwner, ErrBadMode, ErrTooSmall, ErrBadMagic,
		ErrBadVersion, ErrBadGeometry} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return ""
}

// ClampedError reports that a hint above 1024 was written as 1024. The write happened.
type ClampedError struct {
	Requested uint32
	Applied   uint32
}

func (e *ClampedError) Error() string {
	return fmt.Sprintf("sup_bw %d out of range 0..%d: clamped to %d", e.Requested, SupBwMax, e.Applied)
}

func (e *ClampedError) Is(target error) bool { return target == ErrHintClamped }

// Clamp returns v limited to 0..1024 and whether it was clamped.
func Clamp(v uint32) (uint32, bool) {
	if v > SupBwMax {
		return SupBwMax, true
	}
	return v, false
}

func clampErr(v uint32) (uint32, error) {
	c, clamped := Clamp(v)
	if clamped {
		return c, &ClampedError{Requested: v, Applied: c}
	}
	return c, nil
}
