package integration

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestFaultSupDownAtInit: a1's SUP link is down before either process starts (a cable not
// plugged in yet, a switch port still training). The plugin opens the fused device anyway,
// a1 -> a2 runs on SOUT, and once the link comes up the connection's SUP rail comes back by
// itself. net_ib leaves a port that is not active out of its devices; MPIB must not give NCCL no
// device at all then (one NIC failing to open must not close them all). Line:
//
//	fault: case=sup-down-at-init rail=SUP pair=a1-a2 mode=vanilla opened=true continued_on=SOUT rail_joined_ms=N sup_back_ms=N verified=true nccl_errors=0 sout_first_ms=N sout_mbps=N sup_mbps=N
//
// rail_joined_ms runs from the link's return to the send comm's recovery line (node clock),
// held to the fault cases' recovery bound; sup_back_ms to downInitBytes counted on a1's SUP
// netdev (sout_first_ms: the same on SOUT from the drivers' start); sout_mbps and sup_mbps
// are a1's rate on each over 2 s before the link came up and after SUP carried again.
const downInitBytes = 1 << 20

// startWithSupDown takes down's SUP link down (up again when the test ends) and then starts a
// verified vanilla transfer from client to server.
func startWithSupDown(ctx context.Context, t *testing.T, down, server, client *Node) *faultPair {
	t.Helper()
	t.Cleanup(func() { restoreLab(t, down) })
	if _, errOut, code, err := down.Exec(ctx, nil, "sh", "-c", linkDownCmd(down, SUP)); err != nil || code != 0 {
		t.Fatalf("taking %s down: %v exit %d %s", down.Netdev(SUP), err, code, errOut)
	}
	return startFaultPair(ctx, t, server, client, faultEnv(server, "vanilla"), faultEnv(client, "vanilla"),
		"--mode", "verify", "--bytes", "1000G", "--timeout-s", "30", "--max-size", "1M")
}

func TestFaultSupDownAtInit(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fp := startWithSupDown(ctx, t, a1, a2, a1)
	defer fp.killUnlessStopped()
	t0 := time.Now()
	if err := waitRailTraffic(ctx, a1, SOUT, downInitBytes, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now().Add(30*time.Second))
		t.Fatalf("a1 -> a2 with a1's SUP link down at init: no SOUT traffic: %v\nserver %s\nclient %s", err, s, c)
	}
	soutMS := time.Since(t0).Milliseconds()
	soutMbps := txMbpsOver(ctx, t, a1, SOUT, 2*time.Second)
	upMS, backMS, backErr, limit := supBack(ctx, t, fp, a1, a1)
	supMbps := txMbpsOver(ctx, t, a1, SUP, 2*time.Second)
	s, c := fp.stop(ctx, time.Now().Add(60*time.Second))
	m := resultRe.FindStringSubmatch(s.out)
	verifiedOK := s.code == 0 && c.code == 0 && m != nil && m[4] == "true"
	opened := strings.Contains(c.err, "is not active") && !strings.Contains(c.err, "0 fused devices")
	nerr := ncclErrors(s.err, c.err)
	for _, side := range []exitInfo{c, s} {
		var lines []string
		for _, l := range strings.Split(side.err, "\n") {
			if strings.Contains(l, "failover:") || strings.Contains(l, "recovery:") || strings.Contains(l, "degraded") ||
				strings.Contains(l, "not active") || strings.Contains(l, "port 1 is") || strings.Contains(l, "RTS") {
				lines = append(lines, l)
			}
		}
		t.Logf("rail events:\n%s", strings.Join(lines, "\n"))
	}
	// The send comm's SUP recovery after the link came up (node clock): the rail joined.
	joinMS := int64(-1)
	for _, e := range parseRailEvents("a1", c.err) {
		if e.kind == "recovery" && e.rail == SUP && e.side == "send" && e.ms >= upMS {
			joinMS = e.ms - upMS
			break
		}
	}
	evidence("fault:", "case=sup-down-at-init rail=SUP pair=a1-a2 mode=vanilla opened=%v continued_on=SOUT rail_joined_ms=%d sup_back_ms=%d verified=%v nccl_errors=%d sout_first_ms=%d sout_mbps=%.1f sup_mbps=%.1f",
		opened, joinMS, backMS, verifiedOK, nerr, soutMS, soutMbps, supMbps)
	switch {
	case !opened:
		t.Errorf("a1's log does not show its SUP port opened down:\n%s", stderrExcerpt(c.err))
	case !verifiedOK || nerr != 0:
		t.Errorf("the transfer did not end verified without NCCL errors:\nserver %s\nclient %s", s, c)
	case backErr != nil || joinMS < 0 || joinMS > limit:
		t.Errorf("SUP joined the connection %d ms after its link came up and carried 1 MiB after %d ms (%v): want it joined within %d ms\nclient %s",
			joinMS, backMS, backErr, limit, c)
	}
}

// supBack brings down's SUP link up again and waits, for the recovery limit and 10 s more,
// until watch's SUP netdev has sent downInitBytes: the link's return on down's clock (ms), how
// long after it that took (-1 when it did not happen), why not, and the limit (ms).
func supBack(ctx context.Context, t *testing.T, fp *faultPair, down, watch *Node) (upMS, backMS int64, backErr error, limit int64) {
	t.Helper()
	upMS, err := nodeStamp(ctx, down, "ip link set dev "+down.Netdev(SUP)+" up")
	if err != nil {
		t.Fatalf("bringing %s up: %v", down.Netdev(SUP), err)
	}
	up := time.Now()
	limit = currentFaultLimits().recoverMS
	bctx, bcancel := context.WithTimeout(ctx, time.Duration(limit)*time.Millisecond+10*time.Second)
	defer bcancel()
	if backErr = waitRailTraffic(bctx, watch, SUP, downInitBytes, fp.srv, fp.cli); backErr != nil {
		return upMS, -1, backErr, limit
	}
	return upMS, time.Since(up).Milliseconds(), nil, limit
}

// txMbpsOver is what node n sent on rail r over d, in Mbit/s.
func txMbpsOver(ctx context.Context, t *testing.T, n *Node, r Rail, d time.Duration) float64 {
	t.Helper()
	c0, err := n.Counters(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	time.Sleep(d)
	c1, err := n.Counters(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	return float64(c1.TxBytes-c0.TxBytes) * 8 / time.Since(t0).Seconds() / 1e6
}

// TestFaultSupDownAtInitReceiver: the same with the ends swapped: a2 sends to a1, whose SUP
// link is down. The sender's SUP port is up, so it defers its standby SOUT rail (standby.go),
// and then neither end's SUP comes up at connect (a1's port is down; a2's RTR cannot resolve
// a1's address). Both ends say so in the ready acknowledgement and join the standby in the
// handshake; the transfer runs on SOUT, and SUP joins once the link is back. Line:
//
//	fault: case=sup-down-at-init-receiver rail=SUP pair=a2-a1 mode=vanilla joined_at_connect=true continued_on=SOUT sup_back_ms=N verified=true nccl_errors=0
//
// sup_back_ms runs from the link's return to downInitBytes counted on a2's SUP netdev.
func TestFaultSupDownAtInitReceiver(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fp := startWithSupDown(ctx, t, a1, a1, a2)
	defer fp.killUnlessStopped()
	if err := waitRailTraffic(ctx, a2, SOUT, downInitBytes, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now().Add(30*time.Second))
		t.Fatalf("a2 -> a1 with a1's SUP link down at init: no SOUT traffic: %v\nserver %s\nclient %s", err, s, c)
	}
	_, backMS, backErr, limit := supBack(ctx, t, fp, a1, a2)
	s, c := fp.stop(ctx, time.Now().Add(60*time.Second))
	m := resultRe.FindStringSubmatch(s.out)
	verifiedOK := s.code == 0 && c.code == 0 && m != nil && m[4] == "true"
	joined := strings.Contains(c.err, "standby SOUT rail joined in the handshake")
	nerr := ncclErrors(s.err, c.err)
	evidence("fault:", "case=sup-down-at-init-receiver rail=SUP pair=a2-a1 mode=vanilla joined_at_connect=%v continued_on=SOUT sup_back_ms=%d verified=%v nccl_errors=%d",
		joined, backMS, verifiedOK, nerr)
	switch {
	case !verifiedOK || nerr != 0:
		t.Errorf("the transfer did not end verified without NCCL errors:\nserver %s\nclient %s", s, c)
	case !joined:
		t.Errorf("a2's log does not show its standby joined in the handshake:\n%s", stderrExcerpt(c.err))
	case backErr != nil:
		t.Errorf("SUP carried no MiB within %d ms of its link's return (%v):\nclient %s", limit+10000, backErr, c)
	}
}
