package integration

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"
)

// receiverDeviceDeadlineMS bounds the answer when both ends error instead of completing: the
// sender's MPIB_FAILOVER_TIMEOUT_MS (the lab's default, 5000) plus 2 s.
const receiverDeviceDeadlineMS = 5000 + 2000

// TestFaultReceiverDeviceDeleted deletes the receiver's SUP device under a verified a1 -> a2
// transfer (TestFaultFailover deletes the sender's), in both modes. The receiver's NIC dies
// with whatever completions it had queued and not polled, while the sender may already hold
// their acknowledgements: the sender's confirm settles them (docs/failover.md, delivery
// authority). Both ends must complete every request with verified bytes, or both must error
// with a message within the failover timeout plus 2 s; neither may hang.
func TestFaultReceiverDeviceDeleted(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	t.Cleanup(func() { restoreLab(t, a1, a2) })
	for _, mode := range []string{"vanilla", "advanced"} {
		t.Run(mode, func(t *testing.T) {
			t.Cleanup(func() { restoreLab(t, a1, a2) })
			runReceiverDeviceDeleted(t, a1, a2, mode)
		})
	}
}

func runReceiverDeviceDeleted(t *testing.T, a1, a2 *Node, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fc, err := newFaultCtl(ctx, a1, a2)
	if err != nil {
		t.Fatal(err)
	}
	fp := startFaultTransfer(ctx, t, a1, a2, mode, "--max-size", "64K", "--window", "8")
	defer fp.killUnlessStopped()
	time.Sleep(time.Second)
	rcFile := fp.base + ".delrc"
	dev := a2.Dev(SUP)
	x, err := fc.run(ctx, fmt.Sprintf("nsenter -t %d -n bash -c '%s'", fc.pid[a2.Name()], deleteScript(dev, rcFile)))
	if err != nil {
		s, c := fp.stop(ctx, time.Now())
		t.Fatalf("deleting %s: %v\nserver %s\nclient %s", dev, err, s, c)
	}
	t.Cleanup(func() { fc.waitFile(context.Background(), rcFile, 2*time.Minute) })
	time.Sleep(4 * time.Second) // the transfer goes on over SOUT
	s, c := fp.stop(ctx, time.Now().Add(90*time.Second))
	// The events are read once both processes have stopped, when their logs are complete: the
	// receiver's failover line may come after the 4 s above on a loaded host.
	evs := fp.events(ctx)
	t.Logf("rdma link delete %s: %q", dev, fc.waitFile(ctx, rcFile, 90*time.Second))
	m := resultRe.FindStringSubmatch(s.out)
	hang := s.hung || c.hung
	verified := !hang && s.code == 0 && c.code == 0 && m != nil && m[4] == "true"
	senderMS, receiverMS := firstErrorMS(c.out, x.ms), firstErrorMS(s.out, x.ms)
	errorMS := max(senderMS, receiverMS)
	reason := "none" // the receiver's own failover of SUP on its data comm: the deletion reached it
	for _, e := range evs {
		if e.kind == "failover" && e.rail == SUP && fp.dataPath(e) && e.node == a2.Name() && reason == "none" {
			reason = e.reason
		}
	}
	evidence("fault:", "case=receiver-device-deleted rail=SUP mode=%s hang=%v verified=%v error_ms=%d sender_error_ms=%d receiver_error_ms=%d nccl_errors=%d receiver_reason=%s",
		mode, hang, verified, errorMS, senderMS, receiverMS, ncclErrors(s.out, c.out), reason)
	if reason == "none" {
		t.Errorf("the receiver never failed SUP over after its %s was deleted: the case shows nothing\nserver %s\nclient %s", dev, s, c)
	}
	switch {
	case hang:
		t.Errorf("a driver did not exit within 90 s of the stop request after the receiver's %s was deleted\nserver %s\nclient %s", dev, s, c)
	case verified:
	case senderMS < 0 || receiverMS < 0 || errorMS > receiverDeviceDeadlineMS:
		t.Errorf("the transfer neither completed verified nor failed on both ends within %d ms of the deletion (sender %d, receiver %d)\nserver %s\nclient %s",
			receiverDeviceDeadlineMS, senderMS, receiverMS, s, c)
	}
}

var flushesRe = regexp.MustCompile(`flushes=(\d+)`)

// TestFaultFlushAfterFlap flaps the receiver's SUP link under a verified a1 -> a2 transfer whose
// receiver flushes every receive (MPIB_FORCE_FLUSH=1, as on a GPUDirect node): a flush read
// that fails in the flap must be posted again on its loopback QP, reset with its own access,
// never counted as done (plugin/mpib_flush.c; the failover checker proves it schedule by
// schedule), so every flush after the flap orders again and the transfer ends verified with no
// error. failed_reads and reposts count the plugin's own lines: rxe may or may not fail a
// loopback read while its link is down.
func TestFaultFlushAfterFlap(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	t.Cleanup(func() { restoreLab(t, a1, a2) })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	fp := startFaultPair(ctx, t, a2, a1, faultEnv(a2, "vanilla", "MPIB_FORCE_FLUSH=1"), faultEnv(a1, "vanilla", "MPIB_FORCE_FLUSH=1"),
		"--mode", "verify", "--bytes", "1000G", "--timeout-s", "30", "--max-size", "64K", "--window", "8")
	defer fp.killUnlessStopped()
	if err := waitRailTraffic(ctx, a1, SUP, 1<<20, fp.srv, fp.cli); err != nil {
		s, c := fp.stop(ctx, time.Now())
		t.Fatalf("no SUP traffic before the flap: %v\nserver %s\nclient %s", err, s, c)
	}
	if _, err := nodeStamp(ctx, a2, linkDownCmd(a2, SUP)+"; sleep 1.5; ip link set dev "+a2.Netdev(SUP)+" up"+routeBack(a2, SUP)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second) // the rail recovers; flushes go on through both NICs
	s, c := fp.stop(ctx, time.Now().Add(60*time.Second))
	m := resultRe.FindStringSubmatch(s.out)
	verified := !s.hung && !c.hung && s.code == 0 && c.code == 0 && m != nil && m[4] == "true"
	nerr := ncclErrors(s.out, c.out)
	flushes := "0"
	if f := flushesRe.FindStringSubmatch(hasLine(s.out, "nettest-result:")); f != nil {
		flushes = f[1]
	}
	failed := len(linesContaining(s.err, "a flush read failed"))
	ordered := verified && nerr == 0 && flushes != "0"
	evidence("fault:", "case=flush-after-flap rail=SUP flushes=%s failed_reads=%d ordered=%v verified=%v nccl_errors=%d",
		flushes, failed, ordered, verified, nerr)
	if !ordered {
		t.Errorf("flushes after a flap must keep ordering: verified=%v errors=%d flushes=%s\nserver %s\nclient %s", verified, nerr, flushes, s, c)
	}
}
