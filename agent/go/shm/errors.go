package shm

import (
	"errors"
	"fmt"
)

// codeError is a sentinel whose code is shared with the Python agent, the C reader's messages
// and both CLIs' error lines ("mpib-agent CMD: CODE: message").
type codeError struct{ code, msg string }

func (e *codeError) Error() string { return e.msg }

func coded(code, msg string) error { return &codeError{code, msg} }

// Validation sentinels; the names match the codes of the spec's validation table.
var (
	ErrNotRegular  = coded("not_regular", "not_regular")
	ErrBadOwner    = coded("bad_owner", "bad_owner")
	ErrBadMode     = coded("bad_mode", "bad_mode")
	ErrTooSmall    = coded("too_small", "too_small")
	ErrBadMagic    = coded("bad_magic", "bad_magic")
	ErrBadVersion  = coded("bad_version", "bad_version")
	ErrBadGeometry = coded("bad_geometry", "bad_geometry")
)

// Operation sentinels.
var (
	ErrHintClamped   = coded("clamped", "hint clamped to 1024")
	ErrSlotRange     = coded("slot_range", "slot index out of range")
	ErrSlotInactive  = coded("slot_inactive", "slot not active")
	ErrGenChanged    = coded("gen_changed", "the slot's generation changed")
	ErrPeerTableFull = coded("peer_table_full", "peer table full")
	ErrSlotsFull     = coded("slots_full", "no free slot")
	ErrBusy          = coded("busy", "record busy (seqlock)")
	ErrBadClass      = coded("bad_class", "path class must be intra (0) or inter (1)")
	ErrBadPrefix     = coded("bad_prefix", "prefix length must be 0..32")
	ErrNotSupported  = coded("not_supported", "not supported on this platform")
	ErrSegmentLive   = coded("segment_live", "segment in use")
	ErrAgentRunning  = coded("agent_running", "another agent beats this segment")
	ErrSegmentGone   = coded("segment_gone", "the segment was truncated under this process")
)

var allCodes = []error{ErrNotRegular, ErrBadOwner, ErrBadMode, ErrTooSmall, ErrBadMagic,
	ErrBadVersion, ErrBadGeometry, ErrHintClamped, ErrSlotRange, ErrSlotInactive, ErrGenChanged,
	ErrPeerTableFull, ErrSlotsFull, ErrBusy, ErrBadClass, ErrBadPrefix, ErrNotSupported,
	ErrSegmentLive, ErrAgentRunning, ErrSegmentGone}

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

// Code returns the shared code of err ("bad_magic", "slot_inactive", "gen_changed", ...),
// "io" for any other error (file system, ...), "" for nil.
func Code(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range allCodes {
		if errors.Is(err, s) {
			return s.(*codeError).code
		}
	}
	return "io"
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

// GenChangedError refuses a slot hint written for a registration the slot no longer holds:
// the connection the caller meant closed, and the slot may now hold another one.
type GenChangedError struct {
	Slot, Expected, Current uint32
}

func (e *GenChangedError) Error() string {
	return fmt.Sprintf("slot %d: gen_changed: the hint was meant for generation %d, the slot now holds generation %d (that connection closed)",
		e.Slot, e.Expected, e.Current)
}

func (e *GenChangedError) Is(target error) bool { return target == ErrGenChanged }

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
