package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strconv"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
)

func staleNs() uint64 { return uint64(shm.StaleFromEnv()) }

// connView is what list --json prints per connection: the slot's fields as in the vectors
// (testdata/shm) and the hint in effect. mpib-agent-py prints the same objects.
type connView struct {
	shm.Slot
	Effective shm.Resolution `json:"effective"`
}

const listFmt = "%5s %3s %21s %15s %15s %7s %4s %5s %5s %8s %14s %14s %13s %9s %8s %s\n"

func cmdList(args []string, out io.Writer) error {
	fs, path := newFlags("list")
	asJSON := fs.Bool("json", false, "print JSON")
	devs := devFlag(fs)
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	conns, err := s.Connections()
	if err != nil {
		return err
	}
	now := shm.Now()
	views := make([]connView, 0, len(conns))
	for _, c := range conns {
		if devs.keeps(c.Dev) {
			views = append(views, connView{Slot: c, Effective: s.Resolve(c.Index, now, staleNs())})
		}
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	}
	fmt.Fprintln(out, agentStatus(s.Header(), now))
	fmt.Fprintf(out, listFmt, "SLOT", "DEV", "PID:CONN", "LOCAL", "PEER", "CLASS", "DIR", "QPS", "HINT", "SOURCE", "SOUT_BYTES", "SUP_BYTES",
		"RAILS", "FAILOVERS", "SUP_PATH", "NICS")
	for _, v := range views {
		dir := "recv"
		if v.IsSend == 1 {
			dir = "send"
		}
		hint := "-"
		if v.Effective.Applies {
			hint = strconv.Itoa(int(v.Effective.SupBw))
		}
		fmt.Fprintf(out, listFmt, strconv.Itoa(int(v.Index)), strconv.Itoa(int(v.Dev)), fmt.Sprintf("%d:%d", v.PID, v.ConnID),
			v.LocalSoutIP.String(), v.PeerSoutIP.String(), v.PathClass.String(), dir,
			fmt.Sprintf("%d+%d", v.NQPsSout, v.NQPsSup), hint, v.Effective.Source.String(),
			strconv.FormatUint(v.Telemetry.SoutBytes, 10), strconv.FormatUint(v.Telemetry.SupBytes, 10),
			v.Telemetry.SoutState.String()+"/"+v.Telemetry.SupState.String(),
			strconv.FormatUint(uint64(v.Telemetry.Failovers), 10), v.SupPath.String(), nicPair(v.Slot))
	}
	snap, err := s.Snapshot()
	if err != nil {
		return err
	}
	fmt.Fprintln(out, hintTables(snap))
	return nil
}

// hintTables is list's last line: the class and peer defaults as set, whether or not a
// connection uses them now (hints apply only while an agent beats). mpib-agent-py prints the
// same line.
func hintTables(snap *shm.Snapshot) string {
	line := "defaults:"
	for c, r := range snap.Class {
		if r.Valid() {
			line += fmt.Sprintf(" class %s=%d", shm.PathClass(c), r.SupBw)
		}
	}
	for _, p := range snap.Peers {
		if p.Record.Valid() {
			line += fmt.Sprintf(" peer %s/%d=%d", p.Record.PeerIP, p.Record.PrefixLen, p.Record.SupBw)
		}
	}
	if line == "defaults:" {
		line += " none"
	}
	return line
}

func agentStatus(h shm.Header, now uint64) string {
	if h.HeartbeatNs == 0 {
		return "agent: none (hints do not apply; plugins use the vanilla policy)"
	}
	age := int64(now) - int64(h.HeartbeatNs)
	state := "alive"
	if !shm.HeartbeatFresh(h.HeartbeatNs, now, staleNs()) {
		state = "STALE (plugins use the vanilla policy)"
	}
	return fmt.Sprintf("agent: pid %d, last beat %d ms ago, %s", h.AgentPID, age/1e6, state)
}

var uintRe = regexp.MustCompile(`^[0-9]+$`)

// parseSupBw reads --sup-bw: an integer >= 0 (above 1024 is clamped on write).
func parseSupBw(s string) (uint32, error) {
	if !uintRe.MatchString(s) {
		return 0, usagef("--sup-bw %q: want an integer 0..1024 (larger values are clamped)", s)
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		v = 1<<32 - 1
	}
	return uint32(v), nil
}

func cmdSet(args []string, out io.Writer) error {
	fs, path := newFlags("set")
	conn := fs.String("conn", "", "connection: SLOT or PID:CONN_ID")
	genS := fs.String("gen", "", "with --conn: the slot generation the hint is for (default: the one found now)")
	peer := fs.String("peer", "", "peer default: IP or IP/LEN")
	class := fs.String("class", "", "path-class default: intra or inter")
	supBwS := fs.String("sup-bw", "", "SUP share in parts per 1024 (0 all SOUT .. 1024 all SUP)")
	clear := fs.Bool("clear", false, "clear the hint instead of setting it")
	if err := parse(fs, args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := checkSetFlags(given, *clear); err != nil {
		return err
	}
	var v uint32
	if !*clear {
		var err error
		if v, err = parseSupBw(*supBwS); err != nil {
			return err
		}
	}
	valid := !*clear
	// Parse every selector before touching the segment: a bad one is a usage error.
	t, err := parseSetTarget(given, *conn, *genS, *peer, *class)
	if err != nil {
		return err
	}
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
	what, err := t.write(s, v, valid)
	if err != nil {
		return err
	}
	if valid {
		c, _ := shm.Clamp(v)
		fmt.Fprintf(out, "%s: sup_bw=%d\n", what, c)
	} else {
		fmt.Fprintf(out, "%s: cleared\n", what)
	}
	if h := s.Header(); !shm.HeartbeatFresh(h.HeartbeatNs, shm.Now(), staleNs()) {
		warn(fmt.Errorf("no live agent heartbeat: the hint applies once `heartbeat` or `run` is running"))
	}
	return nil
}

// checkSetFlags checks which of set's flags go together (given: the flags on the command line).
func checkSetFlags(given map[string]bool, clear bool) error {
	n := 0
	for _, k := range []string{"conn", "peer", "class"} {
		if given[k] {
			n++
		}
	}
	if n != 1 {
		return usagef("give exactly one of --conn, --peer, --class")
	}
	if clear == given["sup-bw"] {
		return usagef("give either --sup-bw N or --clear")
	}
	if given["gen"] && !given["conn"] {
		return usagef("--gen goes with --conn")
	}
	return nil
}

// setTarget is the hint `set` writes: a connection's (conn), a peer default (peer) or a
// path-class default (class).
type setTarget struct {
	kind   string
	conn   string // --conn as given
	sel    policy.ConnSelector
	gen    uint32 // with hasGen
	hasGen bool
	ip     shm.IPv4
	plen   uint8
	class  shm.PathClass
}

// parseSetTarget reads the one selector given (checkSetFlags made sure of it).
func parseSetTarget(given map[string]bool, conn, genS, peer, class string) (setTarget, error) {
	var t setTarget
	var err error
	switch {
	case given["conn"]:
		t.kind, t.conn = "conn", conn
		if t.sel, err = policy.ParseConnSelector(conn); err != nil {
			return t, usagef("--conn: %v", err)
		}
		if given["gen"] {
			if !uintRe.MatchString(genS) {
				return t, usagef("--gen %q: want an integer", genS)
			}
			g, err := strconv.ParseUint(genS, 10, 32)
			if err != nil {
				return t, usagef("--gen %q: want an integer below 2^32", genS)
			}
			t.gen, t.hasGen = uint32(g), true
		}
	case given["peer"]:
		t.kind = "peer"
		if t.ip, t.plen, err = policy.ParsePeer(peer); err != nil {
			return t, usagef("--peer: %v", err)
		}
	default:
		t.kind = "class"
		if t.class, err = policy.ParseClass(class); err != nil {
			return t, usagef("--class %q: want intra or inter", class)
		}
	}
	return t, nil
}

// write sets (valid) or clears the hint; it returns what the confirmation line names.
func (t setTarget) write(s *shm.Segment, v uint32, valid bool) (string, error) {
	switch t.kind {
	case "conn":
		conns, err := s.Connections()
		if err != nil {
			return "", err
		}
		c, ok := t.sel.Find(conns)
		if !ok {
			return "", fmt.Errorf("connection %s: %w", t.conn, shm.ErrSlotInactive)
		}
		gen := c.Gen
		if t.hasGen {
			gen = t.gen
		}
		if err := reportClamp(s.SetSlotHint(c.Index, gen, v, valid)); err != nil {
			return "", err
		}
		return fmt.Sprintf("slot %d (gen %d)", c.Index, gen), nil
	case "peer":
		if err := reportClamp(s.SetPeerHint(t.ip, t.plen, v, valid)); err != nil {
			return "", err
		}
		return fmt.Sprintf("peer %v/%d", t.ip, t.plen), nil
	default:
		if err := reportClamp(s.SetClassHint(t.class, v, valid)); err != nil {
			return "", err
		}
		return "class " + t.class.String(), nil
	}
}
