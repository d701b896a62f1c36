// Package policy holds the agent's built-in policies: pure decisions over telemetry and a
// weights file, applied through a HintWriter (a *shm.Segment, or a fake in tests). The Python
// agent (agent/python/src/mpib_agent/_policy.py) implements the same rules; the CLI test in
// agent/go/cmd/mpib-agent runs both.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

// HintWriter is the part of *shm.Segment a policy writes through.
type HintWriter interface {
	SetSlotHint(slot, gen uint32, supBw uint32, valid bool) error
	SetPeerHint(ip shm.IPv4, prefixLen uint8, supBw uint32, valid bool) error
	SetClassHint(class shm.PathClass, supBw uint32, valid bool) error
}

// Weights is the static policy file:
//
//	{"class": {"intra": 1024, "inter": 0},
//	 "peers": {"10.0.2.7": 256, "10.0.2.0/24": 512},
//	 "conns": {"3": 700, "4242:7": 128}}
//
// conns keys are a slot index or PID:CONN_ID; values are sup_bw in parts per 1024: JSON
// integers >= 0 (a value above 1024 is written as 1024, with a warning). Every section is
// optional; anything else (unknown fields, fractions, negative numbers, null) is refused.
type Weights struct {
	Class map[string]uint32
	Peers map[string]uint32
	Conns map[string]uint32
}

// ErrBadWeights marks a malformed weights file. Its code is "bad_weights".
var ErrBadWeights = errors.New("bad_weights")

var jsonUint = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// LoadWeights reads and checks a weights file.
func LoadWeights(path string) (*Weights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadWeights, err)
	}
	return ParseWeights(b)
}

// ParseWeights decodes a weights file strictly. A key given twice in one object, or two keys
// of a section that name one target (class "0" and "intra"; peers "10.0.2.7" and
// "10.0.2.7/32"), is refused: the file would otherwise say two things and one would be lost.
func ParseWeights(b []byte) (*Weights, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var top any
	if err := dec.Decode(&top); err != nil {
		return badWeights("not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badWeights("not JSON: data after the object")
	}
	if err := noDuplicateKeys(json.NewDecoder(bytes.NewReader(b))); err != nil {
		return nil, err
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return badWeights("want a JSON object with class, peers and conns")
	}
	w := &Weights{Class: map[string]uint32{}, Peers: map[string]uint32{}, Conns: map[string]uint32{}}
	for _, field := range sortedKeys(obj) {
		var dst map[string]uint32
		var target func(string) (any, error) // what a key names: keys naming one target alias
		switch field {
		case "class":
			dst, target = w.Class, func(k string) (any, error) { return ParseClass(k) }
		case "peers":
			dst, target = w.Peers, func(k string) (any, error) {
				ip, plen, err := ParsePeer(k)
				return [2]uint32{uint32(ip), uint32(plen)}, err
			}
		case "conns":
			dst, target = w.Conns, func(k string) (any, error) { return ParseConnSelector(k) }
		default:
			return badWeights("unknown field %q (class, peers, conns)", field)
		}
		sec, ok := obj[field].(map[string]any)
		if !ok {
			return badWeights("%s: want an object of KEY: sup_bw", field)
		}
		if err := parseSection(field, sec, target, dst); err != nil {
			return nil, err
		}
	}
	return w, nil
}

func badWeights(format string, args ...any) (*Weights, error) {
	return nil, fmt.Errorf("%w: %s", ErrBadWeights, fmt.Sprintf(format, args...))
}

// parseSection checks one section's keys (in sorted order, so that the error a file gets
// does not depend on map order) and values into dst.
func parseSection(field string, sec map[string]any, target func(string) (any, error), dst map[string]uint32) error {
	seen := map[any]string{}
	for _, k := range sortedKeys(sec) {
		t, err := target(k)
		if err != nil {
			_, err = badWeights("%s %q: %v", field, k, err)
			return err
		}
		if first, dup := seen[t]; dup {
			_, err = badWeights("%s %q and %q name the same target: keep one", field, first, k)
			return err
		}
		seen[t] = k
		v := sec[k]
		n, ok := v.(json.Number)
		if !ok || !jsonUint.MatchString(n.String()) {
			_, err = badWeights("%s %q: sup_bw %v: want an integer 0..1024", field, k, v)
			return err
		}
		u, err := strconv.ParseUint(n.String(), 10, 32)
		if err != nil {
			u = 1<<32 - 1 // larger than uint32: clamped to 1024 on write anyway
		}
		dst[k] = uint32(u)
	}
	return nil
}

// noDuplicateKeys walks a JSON document already known to be valid and refuses an object that
// has a key twice (encoding/json keeps the last). An object's own duplicate is reported after
// those of the values inside it, the order in which Python's object_pairs_hook sees them, so
// that both agents name the same key.
func noDuplicateKeys(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		seen, dup := map[string]bool{}, ""
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return err
			}
			key := k.(string)
			if seen[key] && dup == "" {
				dup = key
			}
			seen[key] = true
			if err := noDuplicateKeys(dec); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil {
			return err
		}
		if dup != "" {
			_, err := badWeights("duplicate key %q", dup)
			return err
		}
	case json.Delim('['):
		for dec.More() {
			if err := noDuplicateKeys(dec); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	return nil
}

// ParseClass accepts intra|inter|0|1 (any case).
func ParseClass(s string) (shm.PathClass, error) {
	switch strings.ToLower(s) {
	case "intra", "0":
		return shm.IntraIsland, nil
	case "inter", "1":
		return shm.InterIsland, nil
	}
	return 0, shm.ErrBadClass
}

var peerRe = regexp.MustCompile(`^([0-9]{1,3}(?:\.[0-9]{1,3}){3})(?:/([0-9]{1,2}))?$`)

// ParsePeer accepts IP or IP/LEN (LEN 0..32, default 32). The IP comes back masked to LEN,
// the key a peer entry stores (spec 5.6): 10.0.2.7/24 is 10.0.2.0/24.
func ParsePeer(s string) (shm.IPv4, uint8, error) {
	m := peerRe.FindStringSubmatch(s)
	if m == nil {
		return 0, 0, fmt.Errorf("want IP or IP/LEN, got %q", s)
	}
	ip, err := shm.ParseIPv4(m[1])
	if err != nil {
		return 0, 0, err
	}
	plen := uint64(32)
	if m[2] != "" {
		if plen, _ = strconv.ParseUint(m[2], 10, 8); plen > 32 {
			return 0, 0, shm.ErrBadPrefix
		}
	}
	return ip.Masked(uint8(plen)), uint8(plen), nil
}

// ConnSelector picks a connection by slot index or by (pid, conn_id).
type ConnSelector struct {
	Slot        uint32
	PID         uint32
	ConnID      uint64
	ByPIDConnID bool
}

var connRe = regexp.MustCompile(`^([0-9]+)(?::([0-9]+))?$`)

// ParseConnSelector accepts SLOT or PID:CONN_ID (decimal digits only).
func ParseConnSelector(s string) (ConnSelector, error) {
	m := connRe.FindStringSubmatch(s)
	bad := fmt.Errorf("want SLOT or PID:CONN_ID, got %q", s)
	if m == nil {
		return ConnSelector{}, bad
	}
	if strings.Contains(s, ":") {
		pid, err1 := strconv.ParseUint(m[1], 10, 32)
		conn, err2 := strconv.ParseUint(m[2], 10, 64)
		if err1 != nil || err2 != nil {
			return ConnSelector{}, bad
		}
		return ConnSelector{PID: uint32(pid), ConnID: conn, ByPIDConnID: true}, nil
	}
	slot, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return ConnSelector{}, bad
	}
	return ConnSelector{Slot: uint32(slot)}, nil
}

// Find returns the connection the selector names among conns.
func (c ConnSelector) Find(conns []shm.Slot) (shm.Slot, bool) {
	for _, s := range conns {
		if (!c.ByPIDConnID && s.Index == c.Slot) || (c.ByPIDConnID && s.PID == c.PID && s.ConnID == c.ConnID) {
			return s, true
		}
	}
	return shm.Slot{}, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Gone reports a slot write refused because the connection closed, the slot now holds
// another registration, or the slot lies beyond a smaller segment that replaced the one the
// connection was read from: policies skip it.
func Gone(err error) bool {
	return errors.Is(err, shm.ErrSlotInactive) || errors.Is(err, shm.ErrGenChanged) || errors.Is(err, shm.ErrSlotRange)
}

type slotGen struct{ slot, gen, value uint32 }

// Static is the static policy: the weights file, re-read when it changes.
//   - A file that cannot be read or parsed at the first tick is an error; later, the last good
//     weights stay in force and the failure is reported once (Warnings).
//   - A key deleted from the file clears its hint: its connections return to the default.
//   - conns entries are written for connections that register later too, and again when a
//     slot key's slot is registered again.
//   - After SegmentReplaced, the next Tick writes every default and conns entry again.
type Static struct {
	File string

	w            *Weights // in force
	stamp        string   // mtime+size of the last load attempt
	written      map[string]slotGen
	missing      map[string]bool // conns keys already reported as not (yet) connected
	defaultsLost bool            // the segment was replaced since the class and peer defaults were written
}

// SegmentReplaced tells the policy that its HintWriter now writes another segment (a
// re-created one: Segment.Attachment changed). Nothing it wrote is there, and slot
// generations start again, so it forgets what it wrote: the next Tick writes the class and
// peer defaults and every conns entry again.
func (p *Static) SegmentReplaced() {
	p.written = map[string]slotGen{}
	p.defaultsLost = p.w != nil
}

// Tick applies the weights to conns (the active slots). Notes are lines for the operator,
// warnings are reported once each; err stops the policy.
func (p *Static) Tick(hw HintWriter, conns []shm.Slot) (notes []string, warnings []error, err error) {
	var r tickReport
	nw, werr := p.reload()
	if werr != nil {
		if p.w == nil {
			return nil, nil, werr
		}
		r.warnings = append(r.warnings, fmt.Errorf("%w: keeping the last good weights", werr))
	}
	switch {
	case nw != nil:
		err = p.load(hw, nw, &r)
	case p.defaultsLost:
		err = writeDefaults(hw, p.w, &r)
	}
	if err != nil {
		return r.notes, r.warnings, err
	}
	p.defaultsLost = false
	err = p.applyConns(hw, conns, &r)
	return r.notes, r.warnings, err
}

// tickReport gathers one tick's notes and warnings; an error returns what it holds so far.
type tickReport struct {
	notes    []string
	warnings []error
}

// clamped turns a clamped write into a warning: the hint is in force, at 1024.
func (r *tickReport) clamped(e error) error {
	if errors.Is(e, shm.ErrHintClamped) {
		r.warnings = append(r.warnings, e)
		return nil
	}
	return e
}

// load puts new weights in force: the hints of keys no longer in the file are cleared, the
// class and peer defaults written; conns entries are left to applyConns.
func (p *Static) load(hw HintWriter, nw *Weights, r *tickReport) error {
	old := p.w
	if old == nil {
		old = &Weights{}
	}
	if err := p.clearRemoved(hw, old, nw, r); err != nil {
		return err
	}
	if err := writeDefaults(hw, nw, r); err != nil {
		return err
	}
	p.w, p.written, p.missing = nw, map[string]slotGen{}, map[string]bool{}
	r.notes = append(r.notes, fmt.Sprintf("policy: static weights loaded: %d class, %d peer, %d conn entries",
		len(nw.Class), len(nw.Peers), len(nw.Conns)))
	return nil
}

// clearRemoved clears the hints of old's class and peer keys and of the written conns keys
// that nw no longer has, so that their connections return to the default.
func (p *Static) clearRemoved(hw HintWriter, old, nw *Weights, r *tickReport) error {
	for _, k := range sortedKeys(old.Class) {
		if _, ok := nw.Class[k]; !ok {
			c, _ := ParseClass(k)
			if err := hw.SetClassHint(c, 0, false); err != nil {
				return fmt.Errorf("class %s: %w", k, err)
			}
			r.notes = append(r.notes, fmt.Sprintf("policy: class %s removed: cleared", k))
		}
	}
	for _, k := range sortedKeys(old.Peers) {
		if _, ok := nw.Peers[k]; !ok {
			ip, plen, _ := ParsePeer(k)
			if err := hw.SetPeerHint(ip, plen, 0, false); err != nil {
				return fmt.Errorf("peer %s: %w", k, err)
			}
			r.notes = append(r.notes, fmt.Sprintf("policy: peer %s removed: cleared", k))
		}
	}
	for _, k := range sortedKeys(p.written) {
		if _, ok := nw.Conns[k]; !ok {
			sg := p.written[k]
			if err := hw.SetSlotHint(sg.slot, sg.gen, 0, false); err != nil && !Gone(err) {
				return fmt.Errorf("conn %s: %w", k, err)
			}
			r.notes = append(r.notes, fmt.Sprintf("policy: conn %s removed: slot %d cleared", k, sg.slot))
		}
	}
	return nil
}

// writeDefaults writes nw's class and peer defaults.
func writeDefaults(hw HintWriter, nw *Weights, r *tickReport) error {
	for _, k := range sortedKeys(nw.Class) {
		c, _ := ParseClass(k)
		if err := r.clamped(hw.SetClassHint(c, nw.Class[k], true)); err != nil {
			return fmt.Errorf("class %s: %w", k, err)
		}
	}
	for _, k := range sortedKeys(nw.Peers) {
		ip, plen, _ := ParsePeer(k)
		if err := r.clamped(hw.SetPeerHint(ip, plen, nw.Peers[k], true)); err != nil {
			return fmt.Errorf("peer %s: %w", k, err)
		}
	}
	return nil
}

// applyConns writes the conns entries in force to the connections among conns that do not
// have them yet: new ones, and slots registered again since.
func (p *Static) applyConns(hw HintWriter, conns []shm.Slot, r *tickReport) error {
	for _, k := range sortedKeys(p.w.Conns) {
		sel, _ := ParseConnSelector(k)
		c, ok := sel.Find(conns)
		if !ok {
			if !p.missing[k] {
				p.missing[k] = true
				r.warnings = append(r.warnings, fmt.Errorf("conn %s: no such connection yet (applied when it appears)", k))
			}
			continue
		}
		want := slotGen{c.Index, c.Gen, p.w.Conns[k]}
		if p.written[k] == want {
			continue
		}
		err := r.clamped(hw.SetSlotHint(c.Index, c.Gen, want.value, true))
		if Gone(err) {
			continue // closed since conns was read: the next tick sees what replaced it
		}
		if err != nil {
			return fmt.Errorf("conn %s: %w", k, err)
		}
		delete(p.missing, k)
		p.written[k] = want
		v, _ := shm.Clamp(want.value)
		r.notes = append(r.notes, fmt.Sprintf("policy: conn %s: slot %d (gen %d) sup_bw=%d", k, c.Index, c.Gen, v))
	}
	return nil
}

// reload returns new weights when the file changed and parses, nil when unchanged.
func (p *Static) reload() (*Weights, error) {
	st, err := os.Stat(p.File)
	if err != nil {
		if stamp := "missing:" + err.Error(); stamp != p.stamp {
			p.stamp = stamp
			return nil, fmt.Errorf("%w: %v", ErrBadWeights, err)
		}
		return nil, nil
	}
	stamp := st.ModTime().Format(time.RFC3339Nano) + "/" + strconv.FormatInt(st.Size(), 10)
	if stamp == p.stamp {
		return nil, nil
	}
	w, err := LoadWeights(p.File)
	p.stamp = stamp
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.File, err)
	}
	return w, nil
}
