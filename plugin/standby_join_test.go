package main

import (
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// joinEnds runs runJoinNow's two ends over a socket pair with fake verbs steps: senderNow is
// the sender's step that brings its QPs up. It returns the receiver's error and when it
// returned, and the sender's error and when its QPs were up (zero: never).
func joinEnds(t *testing.T, senderNow func() error) (recvErr error, recvDone time.Time, sendErr error, sendUp time.Time) {
	t.Helper()
	sc, rc := socketPair(t)
	defer sc.Close()
	defer rc.Close()
	deadline := time.Now().Add(5 * time.Second)
	sc.SetDeadline(deadline)
	rc.SetDeadline(deadline)
	peer := netip.MustParseAddr("10.0.0.2")
	var up atomic.Int64
	send := joinOps{
		build: func() error { return nil },
		info:  func() []byte { return append([]byte{'J', 0}, make([]byte, joinInfoSize)...) },
		stage: func([]byte) error { return nil },
		now: func() error {
			err := senderNow()
			if err == nil {
				up.Store(time.Now().UnixNano())
			}
			return err
		},
	}
	recv := joinOps{stage: func([]byte) error { return nil }, now: func() error { return nil }}
	sent := make(chan error, 1)
	go func() {
		err := runJoinNow(sc, 0, true, send, peer)
		if err != nil {
			sc.Close() // as the handshake does with a failed connection
		}
		sent <- err
	}()
	recvErr = runJoinNow(rc, 0, false, recv, peer)
	recvDone = time.Now()
	sendErr = <-sent
	if n := up.Load(); n != 0 {
		sendUp = time.Unix(0, n)
	}
	return recvErr, recvDone, sendErr, sendUp
}

// The receiver of an in-handshake join hands its comm to NCCL only once the sender's QPs are
// up: its first receive posts a CTS on the rail, which a sender QP short of RTR drops.
func TestJoinNowReceiverWaitsForTheSendersQPs(t *testing.T) {
	recvErr, recvDone, sendErr, sendUp := joinEnds(t, func() error {
		time.Sleep(100 * time.Millisecond) // queued for a verbs slot behind a connect burst
		return nil
	})
	if recvErr != nil || sendErr != nil {
		t.Fatalf("receiver: %v, sender: %v; want both joined", recvErr, sendErr)
	}
	if recvDone.Before(sendUp) {
		t.Errorf("the receiver returned %v before the sender's QPs were up", sendUp.Sub(recvDone))
	}
}

// A sender whose end of the join fails tells the receiver, which fails its handshake (NCCL
// must not hold a comm whose peer gave up), with the sender's errno.
func TestJoinNowSenderFailureFailsTheReceiver(t *testing.T) {
	recvErr, _, sendErr, _ := joinEnds(t, func() error { return syscall.ENETUNREACH })
	if !errors.Is(sendErr, syscall.ENETUNREACH) {
		t.Errorf("sender: %v, want ENETUNREACH", sendErr)
	}
	if !errors.Is(recvErr, syscall.ENETUNREACH) {
		t.Errorf("receiver: %v, want the sender's ENETUNREACH", recvErr)
	}
}

// A sender that closes the socket after the receiver's 'K' (its process ended) fails the
// receiver's handshake too.
func TestJoinNowSenderGoneFailsTheReceiver(t *testing.T) {
	sc, rc := socketPair(t)
	defer rc.Close()
	rc.SetDeadline(time.Now().Add(5 * time.Second))
	go func() {
		sc.Write(append([]byte{'J', 0}, make([]byte, joinInfoSize)...))
		b := make([]byte, 2)
		sc.Read(b)
		sc.Close()
	}()
	ops := joinOps{stage: func([]byte) error { return nil }, now: func() error { return nil }}
	err := runJoinNow(rc, 0, false, ops, netip.MustParseAddr("10.0.0.2"))
	if err == nil || !strings.Contains(err.Error(), "its end of the standby SOUT rail") {
		t.Errorf("receiver: %v, want a failure for the sender's missing last word", err)
	}
}

func TestJoinDoneMessage(t *testing.T) {
	peer := netip.MustParseAddr("10.0.0.2")
	tests := []struct {
		name    string
		msg     []byte
		wantErr string // "" = joined
	}{
		{"ready", joinDoneMessage(0, nil), ""},
		{"failed with errno", joinDoneMessage(0, errors.Join(errors.New("x"), syscall.ENODEV)), "no such device"},
		{"failed, no errno", joinDoneMessage(0, errors.New("the listener closed")), "could not bring its end"},
		{"another rail", []byte{'R', 1, 0}, "not the end of"},
		{"ready with a code", []byte{'R', 0, 5}, "not the end of"},
		{"another kind", []byte{'K', 0, 0}, "not the end of"},
		{"short", []byte{'R', 0}, "not the end of"},
	}
	for _, tt := range tests {
		err := joinDoneErr(tt.msg, 0, peer)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s (% x): %v, want %q", tt.name, tt.msg, err, tt.wantErr)
		}
	}
}

// NCCL's close of a comm whose standby builder waits for a verbs slot (every slot taken by
// other connections' setups) does not wait for the slot, and no QPs are built for it once the
// slot comes.
func TestCloseDoesNotWaitForTheStandbysVerbsSlot(t *testing.T) {
	conn, peer := socketPair(t)
	defer peer.Close()
	lc := adoptFake(t, conn, false) // a receiver's comm: a build on it would fail (-EINVAL)
	for range cap(verbsSlots) {
		verbsSlots <- struct{}{}
	}
	released := false
	release := func() {
		if !released {
			released = true
			for range cap(verbsSlots) {
				<-verbsSlots
			}
		}
	}
	defer release()
	built := make(chan error, 1)
	go func() { built <- lc.buildStandby() }()
	time.Sleep(20 * time.Millisecond) // the builder is queued for a slot
	stopped := make(chan struct{})
	go func() { lc.stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Second):
		t.Error("close waited for the standby builder's verbs slot")
	}
	release()
	<-stopped
	if err := <-built; err != nil {
		t.Errorf("standby builder: %v; want nothing built for a closed comm", err)
	}
}
