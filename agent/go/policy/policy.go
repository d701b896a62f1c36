// Package policy holds the agent's built-in policies: pure decisions over telemetry and a
// weights file, applied through a HintWriter (a *shm.Segment, or a fake in tests).
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/mpib/mpib/agent/go/shm"
)

// HintWriter is the part of *shm.Segment a policy writes through.
type HintWriter interface {
	SetSlotHint(slot uint32, supBw uint32, valid bool) error
	SetPeerHint(ip shm.IPv4, prefixLen uint8, supBw uint32, valid bool) error
	SetClassHint(class shm.PathClass, supBw uint32, valid bool) error
}

// Weights is the static policy file:
//
//	{"class": {"intra": 1024, "inter": 0},
//	 "peers": {"10.0.2.7": 256, "10.0.2.0/24": 512},
//	 "conns": {"3": 700, "4242:7": 128}}
//
// conns keys are a slot index or PID:CONN_ID; values are sup_bw in parts per 1024.
type Weights struct {
	Class map[string]uint32 `json:"class"`
	Peers map[string]uint32 `json:"peers"`
	Conns map[string]uint32 `json:"conns"`
}

// ErrBadWeights marks a malformed weights file.
var ErrBadWeights = errors.New("bad weights file")

// LoadWeights reads and checks a weights file.
func LoadWeights(path string) (*Weights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load weights: %w", err)
	}
	return ParseWeights(b)
}

// ParseWeights decodes a weights file strictly (unknown fields and bad keys are errors).
func ParseWeights(b []byte) (*Weights, error) {
	var w Weights
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadWeights, err)
	}
	for k := range w.Class {
		if _, err := ParseClass(k); err != nil {
			return nil, fmt.Errorf("%w: class %q: %v", ErrBadWeights, k, err)
		}
	}
	for k := range w.Peers {
		if _, _, err := ParsePeer(k); err != nil {
			return nil, fmt.Errorf("%w: peer %q: %v", ErrBadWeights, k, err)
		}
	}
	for k := range w.Conns {
		if _, err := ParseConnSelector(k); err != nil {
			return nil, fmt.Errorf("%w: conn %q: %v", ErrBadWeights, k, err)
		}
	}
	return &w, nil
}

// ParseClass accepts intra|inter|0|1.
func ParseClass(s string) (shm.PathClass, error) {
	switch strings.ToLower(s) {
	case "intra", "0":
		return shm.IntraIsland, nil
	case "inter", "1":
		return shm.InterIsland, nil
	}
	return 0, shm.ErrBadClass
}

// ParsePeer accepts IP or IP/LEN (LEN defaults to 32).
func ParsePeer(s string) (shm.IPv4, uint8, error) {
	ipStr, lenStr, has := strings.Cut(s, "/")
	ip, err := shm.ParseIPv4(ipStr)
	if err != nil {
		return 0, 0, err
	}
	plen := uint64(32)
	if has {
		if plen, err = strconv.ParseUint(lenStr, 10, 8); err != nil || plen > 32 {
			return 0, 0, shm.ErrBadPrefix
		}
	}
	return ip, uint8(plen), nil
}

// ConnSelector picks a connection by slot index or by (pid, conn_id).
type ConnSelector struct {
	Slot        uint32
	PID         uint32
	ConnID      uint64
	ByPIDConnID bool
}

// ParseConnSelector accepts SLOT or PID:CONN_ID.
func ParseConnSelector(s string) (ConnSelector, error) {
	if p, c, ok := strings.Cut(s, ":"); ok {
		pid, err1 := strconv.ParseUint(p, 10, 32)
		conn, err2 := strconv.ParseUint(c, 10, 64)
		if err1 != nil || err2 != nil {
			return ConnSelector{}, fmt.Errorf("want SLOT or PID:CONN_ID, got %q", s)
		}
		return ConnSelector{PID: uint32(pid), ConnID: conn, ByPIDConnID: true}, nil
	}
	slot, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return ConnSelector{}, fmt.Errorf("want SLOT or PID:CONN_ID, got %q", s)
	}
	return ConnSelector{Slot: uint32(slot)}, nil
}

// Find returns the slot index the selector names among conns.
func (c ConnSelector) Find(conns []shm.Slot) (uint32, bool) {
	for _, s := range conns {
		if (!c.ByPIDConnID && s.Index == c.Slot) || (c.ByPIDConnID && s.PID == c.PID && s.ConnID == c.ConnID) {
			return s.Index, true
		}
	}
	return 0, false
}

// Apply writes every weight. Clamped values and connections not present are reported in
// the returned warnings; a write failure stops with an error.
func (w *Weights) Apply(hw HintWriter, conns []shm.Slot) (warnings []error, err error) {
	note := func(e error) error {
		if errors.Is(e, shm.ErrHintClamped) {
			warnings = append(warnings, e)
			return nil
		}
		return e
	}
	for _, k := range sortedKeys(w.Class) {
		c, _ := ParseClass(k)
		if err := note(hw.SetClassHint(c, w.Class[k], true)); err != nil {
			return warnings, fmt.Errorf("class %s: %w", k, err)
		}
	}
	for _, k := range sortedKeys(w.Peers) {
		ip, plen, _ := ParsePeer(k)
		if err := note(hw.SetPeerHint(ip, plen, w.Peers[k], true)); err != nil {
			return warnings, fmt.Errorf("peer %s: %w", k, err)
		}
	}
	for _, k := range sortedKeys(w.Conns) {
		sel, _ := ParseConnSelector(k)
		slot, ok := sel.Find(conns)
		if !ok {
			warnings = append(warnings, fmt.Errorf("conn %s: %w", k, shm.ErrSlotInactive))
			continue
		}
		if err := note(hw.SetSlotHint(slot, w.Conns[k], true)); err != nil {
			return warnings, fmt.Errorf("conn %s: %w", k, err)
		}
	}
	return warnings, nil
}

func sortedKeys(m map[string]uint32) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
