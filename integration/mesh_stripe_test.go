package integration

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestMeshStripeFailover: a striped SUP rail fails over as a whole when one of its cables
// fails, and comes back over both. A verified a2 -> a3 transfer stripes over the two a2-a3
// cables (docs/mesh.md); a2's parallel cable goes down for 3 s. The connection's SUP rail fails
// over to SOUT (its ranges replay there: a rail's replay bookkeeping is per rail, not per
// cable), SOUT carries the traffic while the cable is down, and once the cable is back the
// rail recovers and both cables carry again. Verified end to end. Fixed line:
//
//	mesh: case=stripe-failover pair=a2-a3 cables=a2_sup_a3p,a2_sup_a3 cut=a2_sup_a3p failovers=N recoveries=N sout_bytes_while_cut=N cut_cable_bytes_after=N other_cable_bytes_after=N verified=true
func TestMeshStripeFailover(t *testing.T) {
	lab := labOrSkip(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	m, err := lab.StartMesh(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(context.Background())
	a2, a3 := m.Node("a2"), m.Node("a3")
	cables := cablesBetween(a2, a3)
	if len(cables) != 2 {
		t.Fatalf("a2 has %d cables to a3, want the lab's two", len(cables))
	}
	cut, other := cables[0], cables[1] // the parallel cable first (meshPorts)
	defer a2.Exec(context.Background(), nil, "ip", "link", "set", "dev", a2.Netdev(cut), "up")
	env := func(n *Node) []string { return append(meshFabricEnv(n, false), "MPIB_FAILOVER=1") }
	fp := startFaultPair(ctx, t, a3, a2, env(a3), env(a2), "--mode", "verify", "--bytes", "1000G", "--timeout-s", "30", "--max-size", "1M", "--window", "8")
	defer fp.killUnlessStopped()
	for _, r := range cables {
		if err := waitRailTraffic(ctx, a2, r, 1<<20, fp.srv, fp.cli); err != nil {
			s, c := fp.stop(ctx, time.Now())
			t.Fatalf("no traffic on a2's %s before the cut (is the SUP rail striped?): %v\nserver %s\nclient %s", a2.Dev(r), err, s, c)
		}
	}
	before, err := a2.RailCounters(ctx, SOUT)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeStamp(ctx, a2, linkDownCmd(a2, cut)+"; sleep 3"); err != nil {
		t.Fatal(err)
	}
	during, err := a2.RailCounters(ctx, SOUT)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeStamp(ctx, a2, "ip link set dev "+a2.Netdev(cut)+" up"); err != nil {
		t.Fatal(err)
	}
	recovered := func(e railEvent) bool { return e.kind == "recovery" && e.rail == SUP && fp.dataPath(e) }
	_, ok := fp.waitEvent(ctx, time.Now().Add(90*time.Second), recovered)
	after0, err := a2.RailCounters(ctx, cables...)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second) // both cables carry again after the recovery
	after1, err := a2.RailCounters(ctx, cables...)
	if err != nil {
		t.Fatal(err)
	}
	var failovers, recoveries int
	for _, e := range fp.events(ctx) {
		if fp.dataPath(e) && e.rail == SUP {
			switch e.kind {
			case "failover":
				failovers++
			case "recovery":
				recoveries++
			}
		}
	}
	s, c := fp.stop(ctx, time.Now().Add(60*time.Second))
	mt := resultRe.FindStringSubmatch(s.out)
	verifiedOK := !s.crashed() && !c.crashed() && mt != nil && mt[4] == "true"
	soutCut := during[SOUT].TxBytes - before[SOUT].TxBytes
	cutAfter, otherAfter := after1[cut].TxBytes-after0[cut].TxBytes, after1[other].TxBytes-after0[other].TxBytes
	names := []string{a2.Dev(cut), a2.Dev(other)}
	evidence("mesh:", "case=stripe-failover pair=a2-a3 cables=%s cut=%s failovers=%d recoveries=%d sout_bytes_while_cut=%d cut_cable_bytes_after=%d other_cable_bytes_after=%d verified=%t",
		strings.Join(names, ","), a2.Dev(cut), failovers, recoveries, soutCut, cutAfter, otherAfter, verifiedOK)
	switch {
	case !verifiedOK:
		t.Errorf("the striped transfer did not end verified:\nserver %s\nclient %s", s, c)
	case failovers == 0 || !ok:
		t.Errorf("a2's %s down: %d SUP failovers, recovered %t: want the striped SUP rail to fail over and come back", a2.Dev(cut), failovers, ok)
	case soutCut < 1<<20:
		t.Errorf("SOUT sent %d bytes while %s was down: want the SUP rail's traffic there", soutCut, a2.Dev(cut))
	case cutAfter < 1<<20 || otherAfter < 1<<20:
		t.Errorf("after the recovery %s sent %d and %s %d bytes in 4 s: want both cables carrying again", a2.Dev(cut), cutAfter, a2.Dev(other), otherAfter)
	}
}
