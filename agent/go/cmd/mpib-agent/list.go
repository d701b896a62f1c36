package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
)

func staleNs() uint64 {
	ms := uint64(shm.DefaultStaleMs)
	if v, err := strconv.ParseUint(os.Getenv("MPIB_AGENT_STALE_MS"), 10, 64); err == nil && v > 0 {
		ms = v
	}
	return ms * 1e6
}

// connView is what list prints per connection (also its --json form).
type connView struct {
	shm.Slot
	Effective shm.Resolution `json:"effective"`
	Source    string         `json:"effective_source"`
}

func cmdList(args []string, out io.Writer) error {
	fs, path := newFlags("list")
	asJSON := fs.Bool("json", false, "print JSON")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	now := shm.Now()
	var views []connView
	for _, c := range s.Connections() {
		r := s.Resolve(c.Index, now, staleNs())
		views = append(views, connView{Slot: c, Effective: r, Source: r.Source.String()})
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(views)
	}
	fmt.Fprintln(out, agentStatus(s.Header(), now))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tPID:CONN\tLOCAL\tPEER\tCLASS\tDIR\tQPS\tHINT\tSOURCE\tSOUT_BYTES\tSUP_BYTES")
	for _, v := range views {
		dir := "recv"
		if v.IsSend == 1 {
			dir = "send"
		}
		hint := "-"
		if v.Effective.Applies {
			hint = strconv.Itoa(int(v.Effective.SupBw))
		}
		fmt.Fprintf(tw, "%d\t%d:%d\t%v\t%v\t%v\t%s\t%d+%d\t%s\t%s\t%d\t%d\n", v.Index, v.PID, v.ConnID,
			v.LocalSoutIP, v.PeerSoutIP, v.PathClass, dir, v.NQPsSout, v.NQPsSup, hint, v.Source,
			v.Telemetry.SoutBytes, v.Telemetry.SupBytes)
	}
	return tw.Flush()
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
	return fmt.Sprintf("agent: pid %d, last beat %.0f ms ago, %s", h.AgentPID, float64(age)/1e6, state)
}

func cmdSet(args []string, out io.Writer) error {
	fs, path := newFlags("set")
	conn := fs.String("conn", "", "connection: SLOT or PID:CONN_ID")
	peer := fs.String("peer", "", "peer default: IP or IP/LEN")
	class := fs.String("class", "", "path-class default: intra or inter")
	supBw := fs.Int64("sup-bw", -1, "SUP share in parts per 1024 (0 all SOUT .. 1024 all SUP)")
	clear := fs.Bool("clear", false, "clear the hint instead of setting it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	n := 0
	for _, v := range []string{*conn, *peer, *class} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("give exactly one of --conn, --peer, --class")
	}
	if *clear == (*supBw >= 0) {
		return fmt.Errorf("give either --sup-bw N or --clear")
	}
	if *supBw > 0xFFFFFFFF {
		*supBw = 0xFFFFFFFF
	}
	v, valid := uint32(max(*supBw, 0)), !*clear
	s, err := shm.Open(*path)
	if err != nil {
		return err
	}
	defer s.Close()
	what := ""
	switch {
	case *conn != "":
		sel, err := policy.ParseConnSelector(*conn)
		if err != nil {
			return err
		}
		slot, ok := sel.Find(s.Connections())
		if !ok {
			return fmt.Errorf("connection %s: %w", *conn, shm.ErrSlotInactive)
		}
		err = report(s.SetSlotHint(slot, v, valid))
		if err != nil {
			return err
		}
		what = fmt.Sprintf("slot %d", slot)
	case *peer != "":
		ip, plen, err := policy.ParsePeer(*peer)
		if err != nil {
			return err
		}
		if err := report(s.SetPeerHint(ip, plen, v, valid)); err != nil {
			return err
		}
		what = fmt.Sprintf("peer %v/%d", ip, plen)
	default:
		c, err := policy.ParseClass(*class)
		if err != nil {
			return err
		}
		if err := report(s.SetClassHint(c, v, valid)); err != nil {
			return err
		}
		what = "class " + c.String()
	}
	if valid {
		c, _ := shm.Clamp(v)
		fmt.Fprintf(out, "%s: sup_bw=%d\n", what, c)
	} else {
		fmt.Fprintf(out, "%s: cleared\n", what)
	}
	if h := s.Header(); !shm.HeartbeatFresh(h.HeartbeatNs, shm.Now(), staleNs()) {
		warn(fmt.Errorf("no live agent heartbeat: the hint applies once `mpib-agent heartbeat` or `run` is running"))
	}
	return nil
}
