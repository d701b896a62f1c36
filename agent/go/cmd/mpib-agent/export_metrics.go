package main

import (
	"errors"
	"io/fs"
	"strconv"
	"sync"

	"github.com/mpib/mpib/agent/go/shm"
)

// exporter serves a segment's telemetry as Prometheus metrics (docs/metrics.md). Each scrape
// opens the segment, reads it and closes it again: nothing is served from an older read, a
// segment replaced at the path is followed at once, and the exporter never writes to it.
type exporter struct {
	path    string
	staleNs uint64        // MPIB_AGENT_STALE_MS, as the plugin reads it
	now     func() uint64 // CLOCK_MONOTONIC ns (the heartbeat's clock)

	mu      sync.Mutex // one scrape at a time: accounts and lastErr are shared
	acc     *accounts
	lastErr string // the last scrape's error ("" when it read the segment)
}

func newExporter(path string, maxPeers int) *exporter {
	return &exporter{path: path, staleNs: staleNs(), now: shm.Now, acc: newAccounts(maxPeers)}
}

// scrapeResult is what one scrape read, ready to be written out.
type scrapeResult struct {
	err    error
	header shm.Header
	now    uint64
	live   []liveConn
	totals map[seriesKey]counts
}

// scrape reads the segment and folds it into the accounts. changed reports an error that
// differs from the previous scrape's (the caller logs it once, not at every scrape).
func (e *exporter) scrape() (res scrapeResult, changed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	snap, err := readSegment(e.path)
	res.err, res.now = err, e.now()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	changed, e.lastErr = msg != e.lastErr, msg
	if err == nil {
		res.header = snap.Header
		res.live = e.acc.update(snap, res.now)
	}
	// Counters are served whether or not this read worked: a series that vanished while the
	// segment is briefly unreadable would restart from its first sample in Prometheus.
	res.totals = e.acc.totals()
	return res, changed
}

// readSegment opens, validates (owner, mode, magic, version, geometry) and decodes the
// segment, then closes it.
func readSegment(path string) (*shm.Snapshot, error) {
	s, err := shm.Open(path)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Snapshot()
}

// errorCode is the code label of mpib_segment_error_info: the agents' shared codes, with
// "missing" for no file at the path.
func errorCode(err error) string {
	if errors.Is(err, fs.ErrNotExist) {
		return "missing"
	}
	return shm.Code(err)
}

// railNames label the rails as the CLIs name them.
var railNames = [2]string{"sout", "sup"}

// railCounterMetrics describe the per-rail counters; scale turns the segment's unit into the
// metric's base unit (ns to seconds).
var railCounterMetrics = [nRailCounters]struct {
	name, help string
	scale      float64
}{
	postedBytes:       {"mpib_rail_posted_bytes_total", "Bytes posted on the rail (replays after a failover included).", 1},
	postedRequests:    {"mpib_rail_posted_requests_total", "Requests posted with data on the rail.", 1},
	completedBytes:    {"mpib_rail_completed_bytes_total", "Bytes whose completion the sender saw on the rail (send connections).", 1},
	completedRequests: {"mpib_rail_completed_requests_total", "Requests whose part on the rail completed (send connections).", 1},
	busyNs:            {"mpib_rail_busy_seconds_total", "Sum of completion minus post time over the completed requests: divided by their rate, the mean latency.", 1e-9},
}

// families builds every metric of a scrape.
func (e *exporter) families(res scrapeResult) []*family {
	fams := segmentFamilies(res, e.staleNs)
	fams = append(fams, counterFamilies(res.totals)...)
	return append(fams, gaugeFamilies(res)...)
}

// segmentFamilies are the node-wide metrics: the segment's health and the agent's heartbeat.
func segmentFamilies(res scrapeResult, staleNs uint64) []*family {
	up := gaugeFamily("mpib_segment_up", "1 when the exporter read the hint segment at this scrape, 0 when it could not (see mpib_segment_error_info).")
	errInfo := gaugeFamily("mpib_segment_error_info", "Why the segment could not be read, as the agents' error code (missing, bad_owner, bad_mode, bad_magic, bad_version, ...); 1 while it cannot.")
	slots := gaugeFamily("mpib_segment_slots", "Connection slots in the segment (a plugin whose connections find none free steers them without hints).")
	age := gaugeFamily("mpib_agent_heartbeat_age_seconds", "Time since the agent's last heartbeat (absent when no agent ever beat, or after a clean stop).")
	agentUp := gaugeFamily("mpib_agent_up", "1 while the heartbeat is fresh (within MPIB_AGENT_STALE_MS): plugins apply hints; 0: they use their vanilla split.")
	if res.err != nil {
		up.add(0)
		errInfo.add(1, "code", errorCode(res.err))
		return []*family{up, errInfo}
	}
	up.add(1)
	slots.add(float64(res.header.NSlots))
	hb := res.header.HeartbeatNs
	if hb != 0 {
		age.add(float64(int64(res.now-hb)) / 1e9)
	}
	fresh := 0.0
	if shm.HeartbeatFresh(hb, res.now, staleNs) {
		fresh = 1
	}
	agentUp.add(fresh)
	return []*family{up, errInfo, slots, age, agentUp}
}

// counterFamilies are the per-key counters, retired registrations included.
func counterFamilies(totals map[seriesKey]counts) []*family {
	var fams []*family
	for i, m := range railCounterMetrics {
		f := counterFamily(m.name, m.help)
		for k, c := range totals {
			for r, rail := range railNames {
				f.add(float64(c.rail[r][i])*m.scale, "dev", k.dev, "peer", k.peer, "dir", k.dir, "rail", rail)
			}
		}
		fams = append(fams, f)
	}
	fo := counterFamily("mpib_rail_failovers_total", "Times a rail of a connection left service (up to down or failed), either rail.")
	rec := counterFamily("mpib_rail_recoveries_total", "Times a rail of a connection came back into service (down or failed to up), either rail.")
	for k, c := range totals {
		fo.add(float64(c.failovers), "dev", k.dev, "peer", k.peer, "dir", k.dir)
		rec.add(float64(c.recoveries), "dev", k.dev, "peer", k.peer, "dir", k.dir)
	}
	return append(fams, fo, rec)
}

// railStates label mpib_rail_state_connections; every value other than 0..2 is "unknown".
var railStates = []string{"up", "down", "failed", "unknown"}

func railStateLabel(s shm.RailState) string {
	if int(s) < 3 {
		return railStates[s]
	}
	return "unknown"
}

// splitSources label mpib_split_source_connections: the hint-read sources of spec 5.3.
var splitSources = []string{"slot", "peer", "class", "no_hint", "stale", "inactive", "busy", "bad_slot"}

// gaugeFamilies describe the ACTIVE connections: how many, their rail states, the split
// applied and where it came from, the devices' NICs.
func gaugeFamilies(res scrapeResult) []*family {
	conns := gaugeFamily("mpib_connections", "Active connections (0 once a peer's connections closed).")
	states := gaugeFamily("mpib_rail_state_connections", "Active connections whose rail is in the state: up (in service), down (out of service after a failover, retried), failed (device gone), unknown.")
	type keyStates struct {
		n      int
		states map[[2]string]int // (rail, state) -> connections
	}
	per := map[seriesKey]*keyStates{}
	for k := range res.totals { // every key with counters, so that a closed peer reads 0
		per[k] = &keyStates{states: map[[2]string]int{}}
	}
	for _, c := range res.live {
		ks := per[c.key]
		ks.n++
		ks.states[[2]string{"sout", railStateLabel(c.slot.Telemetry.SoutState)}]++
		ks.states[[2]string{"sup", railStateLabel(c.slot.Telemetry.SupState)}]++
	}
	for k, ks := range per {
		conns.add(float64(ks.n), "dev", k.dev, "peer", k.peer, "dir", k.dir)
		for _, rail := range railNames {
			for _, s := range railStates {
				states.add(float64(ks.states[[2]string{rail, s}]), "dev", k.dev, "peer", k.peer, "dir", k.dir, "rail", rail, "state", s)
			}
		}
	}
	fams := []*family{conns, states}
	fams = append(fams, splitFamilies(res.live)...)
	return append(fams, deviceInfo(res.live))
}

// splitFamilies describe the split of the send connections, per (dev, peer).
func splitFamilies(live []liveConn) []*family {
	ratio := gaugeFamily("mpib_split_sup_ratio", "SUP's share of the bytes the plugin applied to its last message (applied_sup_bw/1024, after the topology guard and failover), averaged over the active send connections that published telemetry.")
	sources := gaugeFamily("mpib_split_source_connections", "Active send connections by the source of their last hint read: slot, peer, class (an agent's hint applies), or why none did (no_hint, stale, inactive, busy, bad_slot: the plugin's vanilla split).")
	type acc struct {
		sum     float64
		n       int
		sources map[string]int
	}
	per := map[[2]string]*acc{}
	for _, c := range live {
		if c.key.dir != "send" {
			continue
		}
		k := [2]string{c.key.dev, c.key.peer}
		a := per[k]
		if a == nil {
			a = &acc{sources: map[string]int{}}
			per[k] = a
		}
		a.sources[shm.Source(c.slot.Telemetry.LastSource).String()]++
		if c.slot.Telemetry.FlushWallNs != 0 {
			a.sum += float64(min(c.slot.Telemetry.AppliedSupBw, shm.SupBwMax)) / shm.SupBwMax
			a.n++
		}
	}
	for k, a := range per {
		if a.n > 0 {
			ratio.add(a.sum/float64(a.n), "dev", k[0], "peer", k[1])
		}
		for _, s := range splitSources {
			sources.add(float64(a.sources[s]), "dev", k[0], "peer", k[1], "source", s)
		}
		if n := a.sources["invalid"]; n > 0 { // garbage in last_source
			sources.add(float64(n), "dev", k[0], "peer", k[1], "source", "invalid")
		}
	}
	return []*family{ratio, sources}
}

// deviceInfo names each fused device's NICs (one series per device: from its lowest active
// slot), for joins in PromQL: ... * on(dev) group_left(sout_nic, sup_nic) mpib_device_info.
func deviceInfo(live []liveConn) *family {
	info := gaugeFamily("mpib_device_info", "The NICs of a fused device (the plugin's dev): sout_nic and sup_nic as the connections registered them; always 1.")
	seen := map[string]bool{}
	for _, c := range live { // slot order
		dev := strconv.Itoa(int(c.slot.Dev))
		if c.slot.Dev > maxDevLabel || seen[dev] {
			continue
		}
		seen[dev] = true
		info.add(1, "dev", dev, "sout_nic", c.slot.SoutNIC, "sup_nic", c.slot.SupNIC)
	}
	return info
}
