package integration

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMeshFabric runs the plugin on the lab's SUP mesh (mesh.go, docs/mesh.md): island A a full
// mesh a1-a2-a3 with a parallel a2-a3 cable whose /29 shares a /24 with a1-a3, island B a ring
// b1-b2-b3-b4 whose b2 and b3 forward between their cables. Every node's MPIB_HCA_SUP names all
// its cables (parallel cables first, so a /24 matcher would take the wrong one). Vanilla mode:
// an island pair's data all goes on SUP when a pair of ports reaches the peer. Fixed lines:
//
//	mesh: pair=a1-a3 mode=vanilla relay=off path=direct sup_ports=a1_sup_a3 link_tx_bytes=N other_sup_tx_bytes=N sout_tx_bytes=N verified=true cables=a1_sup_a3 striped=false peer_port=a3_sup_a1 peer_link_rx_bytes=N
//	mesh: pair=a2-a3 mode=vanilla relay=off path=direct sup_ports=a2_sup_a3,a2_sup_a3p link_tx_bytes=N,N ... striped=true peer_port=a3_sup_a2,a3_sup_a2p peer_link_rx_bytes=N,N
//	mesh: pair=b1-b3 mode=vanilla relay=off path=none sup_qps=0 sup_tx_bytes=N sout_tx_bytes=N verified=true
//	mesh: pair=b1-b3 mode=vanilla relay=on path=routed via=b2 sup_ports=b1_sup_b2 relay_rx_bytes=N relay_tx_bytes=N relay_rdma_pkts=N verified=true relay_fwd_pkts=N other_sup_tx_bytes=N sout_tx_bytes=N
//	mesh: pair=b1-b4 topo=line mode=vanilla relay=on path=routed via=b2,b3 sup_ports=b1_sup_b2 relay_rx_bytes=N,N relay_tx_bytes=N,N relay_rdma_pkts=N verified=true ...
//	mesh: case=agent-record pair=b1-b3 relay=on sup_path=routed listed=N python_sup_path=routed verified=true
//	mesh: case=relay-mismatch pair=b1-b3 relay=b1:1,b3:0 error_ms=N hang=false client_named=true server_named=true wall_ms=N
//
// The sender's counters judge direct and none pairs: the chosen cable carries the payload,
// its other SUP ports and SOUT under 1 % of it (none: SUP under 1 %). A routed pair's relay
// node runs no MPIB process: its cable from the sender receives the payload and its cable to
// the receiver sends it (each >= payload), and its rxe devices see under 1 % of the packets it
// forwards (the kernel forwards them; soft-RoCE never does). The line is the ring with its
// b4-b1 cable down: b1 reaches b4 through b2 and b3.
func TestMeshFabric(t *testing.T) {
	lab := labOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	m, err := lab.StartMesh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	took, phases := m.Ready()
	evidence("lab:", "mesh up in %.1f s (%s; namespace nodes a3 b3 b4, %d cables)", took.Seconds(), phases, len(meshLinkSpecs))
	t.Run("direct", func(t *testing.T) {
		for _, p := range [][2]string{{"a1", "a2"}, {"a1", "a3"}, {"a3", "a1"}, {"a2", "a3"}, {"b1", "b2"}, {"b2", "b3"}, {"b3", "b4"}, {"b4", "b1"}} {
			meshDirect(ctx, t, m, m.Node(p[0]), m.Node(p[1]))
		}
	})
	t.Run("none", func(t *testing.T) { meshNone(ctx, t, m, m.Node("b1"), m.Node("b3")) })
	t.Run("routed", func(t *testing.T) {
		meshRouted(ctx, t, m, m.Node("b1"), m.Node("b3"), []*Node{m.Node("b2")}, "")
		meshRouted(ctx, t, m, m.Node("b2"), m.Node("b4"), []*Node{m.Node("b3")}, "")
	})
	t.Run("line", func(t *testing.T) {
		if err := m.SetLine(ctx, true); err != nil {
			t.Fatal(err)
		}
		defer m.SetLine(context.Background(), false)
		meshRouted(ctx, t, m, m.Node("b1"), m.Node("b4"), []*Node{m.Node("b2"), m.Node("b3")}, "line")
	})
	t.Run("agent-record", func(t *testing.T) {
		// Routed only: a direct pair's record was measured too (b1-b2: sup_path=direct), but it
		// added a minute to CI, and which value a plan records is TestRecordPath's table.
		meshAgentRecord(ctx, t, m.Node("b1"), m.Node("b3"), "routed")
	})
	t.Run("relay-mismatch", func(t *testing.T) {
		for _, relayOnClient := range []bool{true, false} {
			meshRelayMismatch(ctx, t, m, m.Node("b1"), m.Node("b3"), relayOnClient)
		}
	})
}

// meshRun is one verified transfer from -> to and the counters it moved.
type meshRun struct {
	payload  uint64
	sender   map[Rail]Counters            // from's SOUT and SUP ports
	receiver map[Rail]Counters            // to's SUP ports
	relays   map[string]map[Rail]Counters // each relay node's cables
	log      string                       // the sender's stderr
	supQPs   int
	plan     string // the send comm's SUP pair, e.g. "direct 10.9.13.1/29 -> 10.9.13.2"
	port     string // the device its SUP QPs are on ("-": none)
}

func meshTransfer(ctx context.Context, t *testing.T, from, to *Node, relays []*Node, relayOn bool) meshRun {
	t.Helper()
	sample := func(n *Node, rails []Rail) map[Rail]Counters { return meshCounters(ctx, t, n, rails...) }
	senderRails := append([]Rail{SOUT}, meshPorts(from)...)
	b0, r0 := sample(from, senderRails), map[string]map[Rail]Counters{}
	p0 := sample(to, meshPorts(to))
	for _, n := range relays {
		r0[n.Name()] = sample(n, n.Links())
	}
	srv, cli := startPair(ctx, t, nettestPair{server: to, client: from, serverEnv: meshFabricEnv(to, relayOn), clientEnv: meshFabricEnv(from, relayOn),
		args: []string{"--timeout-s", "90", "--mode", "verify", "--bytes", fmt.Sprint(meshPayload), "--max-size", "1M", "--window", "8"}})
	res := waitPair(ctx, t, srv, cli, "the mesh transfer "+from.Name()+" -> "+to.Name())
	run := meshRun{payload: verified(t, res), log: res.clientErr, sender: map[Rail]Counters{}, receiver: map[Rail]Counters{}, relays: map[string]map[Rail]Counters{}}
	for r, c := range sample(from, senderRails) {
		run.sender[r] = c.Sub(b0[r])
	}
	for r, c := range sample(to, meshPorts(to)) {
		run.receiver[r] = c.Sub(p0[r])
	}
	for _, n := range relays {
		run.relays[n.Name()] = map[Rail]Counters{}
		for r, c := range sample(n, n.Links()) {
			run.relays[n.Name()][r] = c.Sub(r0[n.Name()][r])
		}
	}
	mt := sendCommRe.FindStringSubmatch(res.clientErr)
	if mt == nil {
		t.Fatalf("%s -> %s: no send comm INFO line in the sender's log:\n%s", from.Name(), to.Name(), tail(res.clientErr, 3000))
	}
	fmt.Sscan(mt[1], &run.supQPs)
	run.plan, run.port = mt[2], mt[3]
	return run
}

// supTx is what the sender's SUP ports other than keep sent.
func (r meshRun) supTx(from *Node, keep Rail) (n uint64) {
	for _, p := range meshPorts(from) {
		if p != keep {
			n += r.sender[p].TxBytes
		}
	}
	return n
}

// planAddrRe finds each pair's local address in a SUP plan ("direct A/24 -> B + C/29 -> D").
var planAddrRe = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+)/\d+ -> `)

// planPorts is the sender's cable ends a plan's pairs use, in the plan's order (the first
// pair's first; a striped plan has one per parallel cable).
func planPorts(n *Node, plan string) []Rail {
	var out []Rail
	for _, mt := range planAddrRe.FindAllStringSubmatch(plan, -1) {
		for _, r := range meshPorts(n) {
			if n.IP(r) == mt[1] {
				out = append(out, r)
			}
		}
	}
	return out
}

// farEnd is the receiver's end of the sender's cable end r.
func farEnd(from *Node, r Rail) Rail {
	if r == SUP {
		return SUP
	}
	return LinkRail(from.Name(), strings.HasSuffix(string(r), "P"))
}

// meshDirect: a direct pair carries the payload; over parallel cables (a2-a3) the SUP rail
// stripes, each cable 40-60 % of the SUP bytes (the lists in sup_ports, link_tx_bytes,
// peer_port and peer_link_rx_bytes are in the plan's order).
func meshDirect(ctx context.Context, t *testing.T, m *Mesh, from, to *Node) {
	run := meshTransfer(ctx, t, from, to, nil, false)
	pair := from.Name() + "-" + to.Name()
	cables := cablesBetween(from, to)
	names := make([]string, len(cables))
	for i, r := range cables {
		names[i] = from.Dev(r)
	}
	used := planPorts(from, run.plan)
	var devs, links, farDevs, farRxs []string
	var sum, farSum uint64
	shares := []float64{}
	for _, r := range used {
		devs, farDevs = append(devs, from.Dev(r)), append(farDevs, to.Dev(farEnd(from, r)))
		links = append(links, strconv.FormatUint(run.sender[r].TxBytes, 10))
		rx := run.receiver[farEnd(from, r)].RxBytes
		farRxs = append(farRxs, strconv.FormatUint(rx, 10))
		sum, farSum = sum+run.sender[r].TxBytes, farSum+rx
	}
	for _, r := range used {
		shares = append(shares, float64(run.sender[r].TxBytes)/float64(max(sum, 1)))
	}
	var other uint64
	for _, p := range meshPorts(from) {
		if !slices.Contains(used, p) {
			other += run.sender[p].TxBytes
		}
	}
	striped := len(used) > 1
	evidence("mesh:", "pair=%s mode=vanilla relay=off path=direct sup_ports=%s link_tx_bytes=%s other_sup_tx_bytes=%d sout_tx_bytes=%d verified=true cables=%s striped=%t peer_port=%s peer_link_rx_bytes=%s",
		pair, strings.Join(devs, ","), strings.Join(links, ","), other, run.sender[SOUT].TxBytes, strings.Join(names, ","), striped,
		strings.Join(farDevs, ","), strings.Join(farRxs, ","))
	allCables := len(used) > 0
	for _, r := range used {
		allCables = allCables && slices.Contains(cables, r)
	}
	switch {
	case !allCables || !strings.HasPrefix(run.plan, "direct "):
		t.Errorf("%s: SUP pair %q on %s, want direct pairs on its cables to %s (%v)", pair, run.plan, run.port, to.Name(), names)
	case len(cables) > 1 && !striped:
		t.Errorf("%s: %d cables to %s but the SUP rail uses %v: want it striped over all", pair, len(cables), to.Name(), devs)
	case sum < run.payload || farSum < run.payload:
		t.Errorf("%s: the chosen cables sent %s bytes on %v and received %s on %v, of a %d-byte payload", pair, links, devs, farRxs, farDevs, run.payload)
	case other*100 >= run.payload || run.sender[SOUT].TxBytes*100 >= run.payload:
		t.Errorf("%s: other SUP ports sent %d and SOUT %d bytes, want each under 1 %% of %d", pair, other, run.sender[SOUT].TxBytes, run.payload)
	case striped && slices.ContainsFunc(shares, func(x float64) bool { return x < 0.40 || x > 0.60 }):
		t.Errorf("%s: striped cables carried %v of the SUP bytes (%s), want each 40-60 %%", pair, shares, links)
	}
}

func meshNone(ctx context.Context, t *testing.T, m *Mesh, from, to *Node) {
	run := meshTransfer(ctx, t, from, to, nil, false)
	pair := from.Name() + "-" + to.Name()
	sup := run.supTx(from, "")
	evidence("mesh:", "pair=%s mode=vanilla relay=off path=none sup_qps=%d sup_tx_bytes=%d sout_tx_bytes=%d verified=true",
		pair, run.supQPs, sup, run.sender[SOUT].TxBytes)
	switch {
	case run.supQPs != 0 || run.plan != "none":
		t.Errorf("%s: %d SUP QPs, SUP pair %q: want none (no common cable, relay off)", pair, run.supQPs, run.plan)
	case !strings.Contains(run.log, "no SUP pair"):
		t.Errorf("%s: the sender's log does not say why it has no SUP pair:\n%s", pair, tail(run.log, 3000))
	case sup*100 >= run.payload || run.sender[SOUT].TxBytes < run.payload:
		t.Errorf("%s: SUP sent %d and SOUT %d bytes of a %d-byte payload, want SOUT all of it", pair, sup, run.sender[SOUT].TxBytes, run.payload)
	}
}

var viaRe = regexp.MustCompile(`^routed \S+ -> \S+ via (\S+)$`)

// meshRouted: from reaches to through the relays, in order (the kernel forwards; no MPIB
// process runs on them). line names a topology other than the ring, for the line's field.
func meshRouted(ctx context.Context, t *testing.T, m *Mesh, from, to *Node, relays []*Node, line string) {
	run := meshTransfer(ctx, t, from, to, relays, true)
	pair := from.Name() + "-" + to.Name()
	first := relays[0]
	gateway := "?"
	if mt := viaRe.FindStringSubmatch(run.plan); mt != nil {
		for _, r := range first.Links() {
			if first.IP(r) == mt[1] {
				gateway = first.Name()
			}
		}
	}
	chosen, _ := railOfDev(from, run.port)
	// Each relay receives on its cable from the previous hop and sends on its cable to the next.
	var via, rx, tx []string
	var rdma, fwd uint64
	hops := append(append([]*Node{from}, relays...), to)
	bad := ""
	for i, n := range relays {
		in, out := run.relays[n.Name()][LinkRail(hops[i].Name(), false)], run.relays[n.Name()][LinkRail(hops[i+2].Name(), false)]
		via, rx, tx = append(via, n.Name()), append(rx, fmt.Sprint(in.RxBytes)), append(tx, fmt.Sprint(out.TxBytes))
		for _, c := range run.relays[n.Name()] {
			rdma += c.RdmaRxPkts + c.RdmaTxPkts
		}
		fwd += in.RxPkts
		if in.RxBytes < run.payload || out.TxBytes < run.payload {
			bad = fmt.Sprintf("%s received %d and forwarded %d bytes of a %d-byte payload", n.Name(), in.RxBytes, out.TxBytes, run.payload)
		}
	}
	topoField := ""
	if line != "" {
		topoField = " topo=" + line
	}
	evidence("mesh:", "pair=%s%s mode=vanilla relay=on path=routed via=%s sup_ports=%s relay_rx_bytes=%s relay_tx_bytes=%s relay_rdma_pkts=%d verified=true relay_fwd_pkts=%d other_sup_tx_bytes=%d sout_tx_bytes=%d",
		pair, topoField, strings.Join(via, ","), run.port, strings.Join(rx, ","), strings.Join(tx, ","), rdma, fwd, run.supTx(from, chosen), run.sender[SOUT].TxBytes)
	switch {
	case gateway != first.Name() || chosen != LinkRail(first.Name(), false):
		t.Errorf("%s: SUP pair %q on %s, want routed through %s on %s", pair, run.plan, run.port, first.Name(), from.Dev(LinkRail(first.Name(), false)))
	case bad != "":
		t.Errorf("%s: %s", pair, bad)
	case rdma*100 >= fwd:
		t.Errorf("%s: the relays' rxe devices counted %d packets of the %d they forwarded, want under 1 %%", pair, rdma, fwd)
	case run.supTx(from, chosen)*100 >= run.payload || run.sender[SOUT].TxBytes*100 >= run.payload:
		t.Errorf("%s: other SUP ports sent %d and SOUT %d bytes, want each under 1 %% of %d", pair, run.supTx(from, chosen), run.sender[SOUT].TxBytes, run.payload)
	}
}

// meshRelayMismatch: MPIB_SUP_RELAY set on one end only fails the connection on both ends
// within seconds, each naming the setting (the handshake carries the flag both ways), never a
// hang or an RTR timeout. error_ms runs from the client's plugin being ready (its "ready:"
// line) to the later of the two sides' errors, from the plugin's log timestamps
// (MPIB_NETTEST_LOG_MS=1, one clock: the lab VM's): starting two processes under the lab's
// emulated CPUs is not the handshake's time, and a busy host must not flip the verdict.
// wall_ms is the whole run, process starts included.
func meshRelayMismatch(ctx context.Context, t *testing.T, m *Mesh, client, server *Node, relayOnClient bool) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	relay := map[bool]string{true: "1", false: "0"}
	start := time.Now()
	env := func(n *Node, on bool) []string { return append(meshFabricEnv(n, on), "MPIB_NETTEST_LOG_MS=1") }
	srv, cli := startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: env(server, !relayOnClient), clientEnv: env(client, relayOnClient),
		args: []string{"--timeout-s", "30", "--mode", "verify", "--bytes", "1M"}})
	res := waitPair(ctx, t, srv, cli, "the relay-mismatch pair")
	wallMS := time.Since(start).Milliseconds()
	const named = "MPIB_SUP_RELAY differs"
	ready, cErr, sErr := logMS(res.clientErr, "ready: "), logMS(res.clientErr, named), logMS(res.serverErr, named)
	errorMS := int64(-1)
	if ready > 0 && cErr > 0 && sErr > 0 {
		errorMS = max(cErr, sErr) - ready
	}
	cNamed, sNamed := strings.Contains(res.clientErr+res.clientOut, named), strings.Contains(res.serverErr+res.serverOut, named)
	setting := fmt.Sprintf("%s:%s,%s:%s", client.Name(), relay[relayOnClient], server.Name(), relay[!relayOnClient])
	evidence("mesh:", "case=relay-mismatch pair=%s-%s relay=%s error_ms=%d hang=false client_named=%t server_named=%t wall_ms=%d",
		client.Name(), server.Name(), setting, errorMS, cNamed, sNamed, wallMS)
	switch {
	case res.clientCode == 0 || res.serverCode == 0:
		t.Errorf("relay %s: a side succeeded (client %d, server %d):\n%s", setting, res.clientCode, res.serverCode, res)
	case !cNamed || !sNamed:
		t.Errorf("relay %s: want both sides to say %q:\n%s", setting, named, res)
	case errorMS < 0:
		t.Errorf("relay %s: no timestamped ready and error lines to time the failure by:\n%s", setting, res)
	case errorMS > 5000:
		t.Errorf("relay %s: both sides failed only %d ms after the client was ready, want within 5000", setting, errorMS)
	}
}

var logMSRe = regexp.MustCompile(`\[ms=(\d+)\]$`)

// logMS is the timestamp of the first timestamped log line containing what, or 0.
func logMS(log, what string) int64 {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, what) {
			continue
		}
		if mt := logMSRe.FindStringSubmatch(line); mt != nil {
			var ms int64
			fmt.Sscan(mt[1], &ms)
			return ms
		}
	}
	return 0
}

// meshAgentRecord: in advanced mode, with the relay on, the sender's connection records in
// the agent segment say how SUP reaches the peer (format 6 sup_path), as both CLIs list them.
// Fixed line:
//
//	mesh: case=agent-record pair=b1-b3 relay=on sup_path=routed listed=N python_sup_path=routed verified=true
func meshAgentRecord(ctx context.Context, t *testing.T, from, to *Node, want string) {
	t.Helper()
	stop := fmt.Sprintf("/tmp/mesh-record-%d.stop", time.Now().UnixNano())
	defer freshSegments(ctx, t, stop, from, to)()
	advanced := func(n *Node) []string {
		env := meshFabricEnv(n, true)
		for i, e := range env {
			if e == "MPIB_MODE=0" {
				env[i] = "MPIB_MODE=1"
			}
		}
		return append(env, "MPIB_SHM_PATH="+segPath)
	}
	srv, cli := startPair(ctx, t, nettestPair{server: to, client: from, serverEnv: advanced(to), clientEnv: advanced(from),
		// A trickle: the records need a live connection, not its bandwidth, and a Python CLI
		// start beside a full-speed transfer took most of a minute under TCG.
		args: []string{"--timeout-s", "90", "--mode", "verify", "--bytes", "2000M", "--stop-file", stop, "--max-size", "64K", "--window", "1",
			"--idle-us", strconv.Itoa(faultIdleUS)}})
	defer func() {
		srv.Kill(context.Background())
		cli.Kill(context.Background())
	}()
	var conns []deviceConn
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline) && running(cli); time.Sleep(500 * time.Millisecond) {
		if conns = listDev(ctx, t, goAgent, from, 0); len(conns) > 0 {
			break
		}
	}
	py := listDev(ctx, t, pythonAgent, from, 0)
	to.Exec(ctx, nil, "touch", stop)
	verified(t, waitPair(ctx, t, srv, cli, "the agent-record transfer "+from.Name()+" -> "+to.Name()))
	paths := func(cs []deviceConn) string {
		var out []string
		for _, c := range cs {
			if name := c.SupPath.String(); !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
		if len(out) == 0 {
			return "-"
		}
		return strings.Join(out, ",")
	}
	got, gotPy := paths(conns), paths(py)
	evidence("mesh:", "case=agent-record pair=%s-%s relay=on sup_path=%s listed=%d python_sup_path=%s verified=true",
		from.Name(), to.Name(), got, len(conns), gotPy)
	if len(conns) == 0 || got != want || gotPy != want {
		t.Errorf("%s -> %s: %d record(s) with sup_path %s (Python CLI: %s), want %s", from.Name(), to.Name(), len(conns), got, gotPy, want)
	}
}
