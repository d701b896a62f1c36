package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Double faults and ride-through, on real soft-RoCE. The exact interleavings of two
// faults (a rail failing before, during and after the other's replay) belong to the C model
// test (plugin/ctest/replay_model_test.c); these cases run the sequences end to end through
// the kernel's rxe, verified byte for byte by the driver. Where a sequence needs the control
// socket alive, only RoCE (UDP 4791) is dropped, at a node's ingress, so one way. Fixed lines:
//
//	fault: case=double-fault pair=a1-a2 mode=advanced sequence=NAME verified=true nccl_errors=0 stall_ms=N
//	fault: case=ride-through pair=a1-b1 rail=SOUT outage_ms=N stall_ms=N resumed=true verified=true nccl_errors=0
//	fault: case=ride-through pair=a1-a2 rail=both outage_ms=N stall_ms=N resumed=true verified=true nccl_errors=0
//	fault: case=stall-timeout pair=a1-b1 outage=permanent sender_error_ms=N receiver_error_ms=N hang=false

// roceAction is the gact index of each rail's RoCE filter (the black hole's is 41).
var roceAction = map[Rail]string{SOUT: "51", SUP: "52"}

// rocePrep installs, at n's ingress on rail r, a filter that matches RoCE v2 (UDP port 4791)
// with an action switched between pass and drop: TCP (the control socket) and ARP pass.
func rocePrep(n *Node, r Rail) string {
	d := n.Netdev(r)
	return fmt.Sprintf("tc qdisc add dev %[1]s ingress 2>/dev/null; tc filter add dev %[1]s parent ffff: protocol ip prio 1 "+
		"u32 match ip protocol 17 0xff match ip dport 4791 0xffff action gact pass index %[2]s", d, roceAction[r])
}

// roceSwitch sets the verdict (drop or pass) of the RoCE filters of the given rails in a node.
func roceSwitch(verdict string, rails ...Rail) string {
	var cmds []string
	for _, r := range rails {
		cmds = append(cmds, "tc actions change action gact "+verdict+" index "+roceAction[r])
	}
	return strings.Join(cmds, "; ")
}

// timedFault is one command at a moment of the sequence (from the first one), in one node.
type timedFault struct {
	at     time.Duration
	n      *Node
	script string
}

type timedResult struct {
	verified        bool
	nerr            int
	stallMS         int64
	firstMS, lastMS int64 // node clock of the first and the last command
	resumed         bool  // the plugin logged a ride-through that resumed
	s, c            exitInfo
}

// runTimedFaults runs a verified client -> server transfer (64 KiB messages, window 8) through
// the commands at their moments, lets it run for settle after the last and stops it.
func runTimedFaults(t *testing.T, server, client *Node, mode string, dataRail Rail, prep []timedFault, steps []timedFault,
	settle time.Duration, extraEnv ...string) timedResult {
	t.Helper()
	return runTimedFaultsEvents(t, server, client, mode, dataRail, prep, steps, settle, nil, extraEnv...)
}

// runTimedFaultsEvents is runTimedFaults that also returns the plugin's rail events in *evs.
func runTimedFaultsEvents(t *testing.T, server, client *Node, mode string, dataRail Rail, prep []timedFault, steps []timedFault,
	settle time.Duration, evsOut *[]railEvent, extraEnv ...string) timedResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, p := range prep {
		if _, err := nodeStamp(ctx, p.n, p.script); err != nil {
			t.Fatalf("preparing the faults: %v", err)
		}
	}
	fp := startFaultPair(ctx, t, server, client, faultEnv(server, mode, extraEnv...), faultEnv(client, mode, extraEnv...),
		"--mode", "verify", "--bytes", "1000G", "--timeout-s", "60", "--max-size", "64K", "--window", "8")
	defer fp.killUnlessStopped()
	if err := waitRailTraffic(ctx, client, dataRail, 1<<20, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now().Add(10*time.Second))
		t.Fatalf("no %s traffic before the faults: %v\nserver %s\nclient %s", dataRail, err, s, c)
	}
	var r timedResult
	start := time.Now()
	for _, st := range steps {
		time.Sleep(time.Until(start.Add(st.at)))
		ms, err := nodeStamp(ctx, st.n, st.script)
		if err != nil {
			s, c := fp.stop(ctx, time.Now().Add(10*time.Second))
			t.Fatalf("fault command in %s: %v\nserver %s\nclient %s", st.n.Name(), err, s, c)
		}
		if r.firstMS == 0 {
			r.firstMS = ms
		}
		r.lastMS = ms
	}
	time.Sleep(settle)
	r.s, r.c = fp.stop(ctx, time.Now().Add(30*time.Second))
	m := resultRe.FindStringSubmatch(r.s.out)
	r.verified = r.s.code == 0 && r.c.code == 0 && m != nil && m[4] == "true" && !r.s.hung && !r.c.hung
	r.nerr = ncclErrors(r.s.out, r.c.out)
	r.stallMS = stallIn(parseGaps(r.s.out, r.c.out), r.firstMS, r.lastMS+settle.Milliseconds())
	r.resumed = strings.Contains(r.c.err+r.s.err, "ride-through: side=") && strings.Contains(r.c.err+r.s.err, " resumed on ")
	var evs []string
	all := fp.events(ctx)
	for _, e := range all {
		evs = append(evs, e.node+": "+e.line)
	}
	if evsOut != nil {
		*evsOut = all
	}
	t.Logf("plugin rail events:\n%s\nserver %s\nclient %s", strings.Join(evs, "\n"), r.s, r.c)
	return r
}

func checkSurvived(t *testing.T, name string, r timedResult, stallLimitMS int64) {
	t.Helper()
	if !r.verified || r.nerr != 0 {
		t.Errorf("%s: the transfer must survive (verified=%v nccl_errors=%d)", name, r.verified, r.nerr)
	}
	if r.stallMS > stallLimitMS {
		t.Errorf("%s: stall_ms=%d, want <= %d", name, r.stallMS, stallLimitMS)
	}
}

// TestFaultDoubleFault: two faults in a1 -> a2 (advanced mode, both rails busy), RoCE dropped
// only, so the control socket (on SOUT's netdev) stays up. Each sequence must deliver every
// byte with no error to the application, whatever the rails do meanwhile.
func TestFaultDoubleFault(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	t.Cleanup(func() { restoreLab(t, a1, a2) })
	prep := []timedFault{{0, a1, rocePrep(a1, SOUT) + "; " + rocePrep(a1, SUP)}, {0, a2, rocePrep(a2, SOUT) + "; " + rocePrep(a2, SUP)}}
	s := time.Second
	for _, seq := range []struct {
		name  string
		steps []timedFault
	}{
		// SUP fails; its ranges are replayed on SOUT; SOUT loses a1 -> a2 while SUP comes back.
		{"replay-carrier-fails", []timedFault{
			{0, a2, roceSwitch("drop", SUP)}, {0, a1, roceSwitch("drop", SUP)},
			{1200 * time.Millisecond, a2, roceSwitch("drop", SOUT)},
			{1400 * time.Millisecond, a2, roceSwitch("pass", SUP)}, {1400 * time.Millisecond, a1, roceSwitch("pass", SUP)},
			{4 * s, a2, roceSwitch("pass", SOUT)}}},
		// SUP fails, then SOUT while SUP is still out (the connection stalls), SUP returns first.
		{"both-fail-in-turn", []timedFault{
			{0, a2, roceSwitch("drop", SUP)}, {0, a1, roceSwitch("drop", SUP)},
			{1500 * time.Millisecond, a2, roceSwitch("drop", SOUT)}, {1500 * time.Millisecond, a1, roceSwitch("drop", SOUT)},
			{3 * s, a2, roceSwitch("pass", SUP)}, {3 * s, a1, roceSwitch("pass", SUP)},
			{4500 * time.Millisecond, a2, roceSwitch("pass", SOUT)}, {4500 * time.Millisecond, a1, roceSwitch("pass", SOUT)}}},
		// SUP fails and comes back; SOUT fails while SUP is being recovered.
		{"fail-during-recovery", []timedFault{
			{0, a2, roceSwitch("drop", SUP)}, {0, a1, roceSwitch("drop", SUP)},
			{1500 * time.Millisecond, a2, roceSwitch("pass", SUP)}, {1500 * time.Millisecond, a1, roceSwitch("pass", SUP)},
			{1700 * time.Millisecond, a2, roceSwitch("drop", SOUT)}, {1700 * time.Millisecond, a1, roceSwitch("drop", SOUT)},
			{4 * s, a2, roceSwitch("pass", SOUT)}, {4 * s, a1, roceSwitch("pass", SOUT)}}},
	} {
		t.Run(seq.name, func(t *testing.T) {
			t.Cleanup(func() { restoreLab(t, a1, a2) })
			r := runTimedFaults(t, a2, a1, "advanced", SUP, prep, seq.steps, 4*time.Second)
			evidence("fault:", "case=double-fault pair=a1-a2 mode=advanced sequence=%s verified=%v nccl_errors=%d stall_ms=%d",
				seq.name, r.verified, r.nerr, r.stallMS)
			// The longest gap is the time no rail worked, plus detection and a recovery: bounded
			// by the sequence's length (the lab suite's wide bound; no target of its own).
			checkSurvived(t, seq.name, r, r.lastMS-r.firstMS+currentFaultLimits().stallMS)
		})
	}
}

// TestFaultRideThrough: every rail of a connection out for 3 s, then back: requests stall and
// resume, nothing fails. a1 -> b1 is inter-island vanilla (SOUT only), cut by the far-end black
// hole (everything a1 sends b1 is dropped, the control socket too); a1 -> a2 loses RoCE on both
// rails both ways. Target: stall_ms <= outage_ms + 1500.
func TestFaultRideThrough(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2, b1 := lab.Node("a1"), lab.Node("a2"), lab.Node("b1")
	t.Cleanup(func() { restoreLab(t, a1, a2, b1) })
	report := func(t *testing.T, pair, rail string, r timedResult) {
		outage := r.lastMS - r.firstMS
		evidence("fault:", "case=ride-through pair=%s rail=%s outage_ms=%d stall_ms=%d resumed=%v verified=%v nccl_errors=%d",
			pair, rail, outage, r.stallMS, r.resumed, r.verified, r.nerr)
		if target := outage + faultTargets.stallMS; r.stallMS > target {
			evidence("fault-target:", "case=ride-through pair=%s stall_ms=%d over its target %d", pair, r.stallMS, target)
		}
		if !r.resumed {
			t.Errorf("ride-through %s: no `ride-through: ... resumed` line: the connection never stalled or never resumed", pair)
		}
		checkSurvived(t, "ride-through "+pair, r, outage+currentFaultLimits().stallMS)
	}
	t.Run("a1-b1-SOUT", func(t *testing.T) {
		t.Cleanup(func() { restoreLab(t, a1, b1) })
		prep := []timedFault{{0, b1, blackholePrep(b1.Netdev(SOUT))}}
		steps := []timedFault{{0, b1, "tc actions change action gact drop index " + blackholeAction},
			{3 * time.Second, b1, "tc actions change action gact pass index " + blackholeAction}}
		report(t, "a1-b1", "SOUT", runTimedFaults(t, b1, a1, "vanilla", SOUT, prep, steps, 4*time.Second))
	})
	t.Run("a1-a2-both", func(t *testing.T) {
		t.Cleanup(func() { restoreLab(t, a1, a2) })
		prep := []timedFault{{0, a1, rocePrep(a1, SOUT) + "; " + rocePrep(a1, SUP)}, {0, a2, rocePrep(a2, SOUT) + "; " + rocePrep(a2, SUP)}}
		steps := []timedFault{{0, a2, roceSwitch("drop", SOUT, SUP)}, {0, a1, roceSwitch("drop", SOUT, SUP)},
			{3 * time.Second, a2, roceSwitch("pass", SOUT, SUP)}, {3 * time.Second, a1, roceSwitch("pass", SOUT, SUP)}}
		report(t, "a1-a2", "both", runTimedFaults(t, a2, a1, "advanced", SUP, prep, steps, 4*time.Second))
	})
	t.Run("stall-timeout", func(t *testing.T) {
		// The only rail never comes back: with the stall limit set low both ends fail, within the
		// error bound, and nobody hangs.
		t.Cleanup(func() { restoreLab(t, a1, b1) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := nodeStamp(ctx, b1, blackholePrep(b1.Netdev(SOUT))); err != nil {
			t.Fatal(err)
		}
		const stallMS = 1500
		ec := runErrorCase(t, b1, a1, SOUT, []string{fmt.Sprintf("MPIB_STALL_TIMEOUT_MS=%d", stallMS)}, func(ctx context.Context, fp *faultPair) (int64, error) {
			return nodeStamp(ctx, b1, "tc actions change action gact drop index "+blackholeAction)
		})
		evidence("fault:", "case=stall-timeout pair=a1-b1 outage=permanent sender_error_ms=%d receiver_error_ms=%d hang=%v",
			ec.senderMS, ec.receiverMS, ec.hang)
		checkErrorCase(t, "stall-timeout", ec, stallMS, true, true)
	})
}

// TestFaultConnectAfterLoss: a connection made while a rail is lost comes up on the other rail
// (NCCL connects lazily, mid-job), with its buffers registered, and the rail joins it when it
// returns. The rail's RoCE is dropped both ways at both ends before the drivers start (the
// control socket shares SOUT's netdev and must live, and SOUT's port must be active at init; a
// SUP link down before the processes start is TestFaultSupDownAtInit's case), so the new
// connection's first use of the rail fails it over; SUP in vanilla mode (the data rail
// intra-island), SOUT in advanced mode with both rails busy. The rail comes back 3 s after
// traffic began. A rail whose QPs cannot even reach RTR at connect (a port down in a running
// process) starts the connection degraded (mpib_comm_connect): the model test's degraded starts.
//
//	fault: case=connect-after-loss rail=R pair=a1-a2 connected=true verified=true rail_joined_ms=N
func TestFaultConnectAfterLoss(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	t.Cleanup(func() { restoreLab(t, a1, a2) })
	for _, c := range []struct {
		rail, data Rail
		mode       string
		prep       []timedFault
		restore    []timedFault
	}{
		{SUP, SOUT, "vanilla", []timedFault{{0, a1, rocePrep(a1, SUP) + "; " + roceSwitch("drop", SUP)},
			{0, a2, rocePrep(a2, SUP) + "; " + roceSwitch("drop", SUP)}},
			[]timedFault{{3 * time.Second, a2, roceSwitch("pass", SUP)}, {3 * time.Second, a1, roceSwitch("pass", SUP)}}},
		{SOUT, SUP, "advanced", []timedFault{{0, a1, rocePrep(a1, SOUT) + "; " + roceSwitch("drop", SOUT)},
			{0, a2, rocePrep(a2, SOUT) + "; " + roceSwitch("drop", SOUT)}},
			[]timedFault{{3 * time.Second, a2, roceSwitch("pass", SOUT)}, {3 * time.Second, a1, roceSwitch("pass", SOUT)}}},
	} {
		t.Run(string(c.rail), func(t *testing.T) {
			t.Cleanup(func() { restoreLab(t, a1, a2) })
			var joined []railEvent
			r := runTimedFaultsEvents(t, a2, a1, c.mode, c.data, c.prep, c.restore, 5*time.Second, &joined)
			connected := true // runTimedFaults fails the test when no traffic flowed after the connect
			joinMS := int64(-1)
			for _, e := range joined {
				if e.kind == "recovery" && e.rail == c.rail && e.side == "send" && e.ms >= r.lastMS {
					joinMS = e.ms - r.lastMS
					break
				}
			}
			evidence("fault:", "case=connect-after-loss rail=%s pair=a1-a2 connected=%v verified=%v rail_joined_ms=%d",
				c.rail, connected, r.verified, joinMS)
			if !r.verified || r.nerr != 0 {
				t.Errorf("connect-after-loss %s: verified=%v nccl_errors=%d", c.rail, r.verified, r.nerr)
			}
			if joinMS > faultTargets.recoverMS {
				evidence("fault-target:", "case=connect-after-loss rail=%s rail_joined_ms=%d over its target %d", c.rail, joinMS, faultTargets.recoverMS)
			}
			if lim := currentFaultLimits().recoverMS; joinMS < 0 || joinMS > lim {
				t.Errorf("connect-after-loss %s: rail_joined_ms=%d, want the rail back in the connection within %d ms of its return", c.rail, joinMS, lim)
			}
		})
	}
}
