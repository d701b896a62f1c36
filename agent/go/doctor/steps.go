package doctor

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Traffic runs the per-rail traffic tests over an established session. The listener leads:
// for each rail ComparePair marked for a test it sends a step (the side-channel port
// mpib-nettest uses: the doctor's port + 1 + the step's number, or why the step is skipped),
// runs the nettest server, reads the peer's result, and sends both sides the merged result.
// The peer follows: it runs the nettest client for each step and applies what it is sent.
// Both sides therefore print the same verdicts.
type Traffic struct {
	Session *Session
	Node    string // this node's name, for the skip reasons
	Nettest Nettest
	Peer    Report // the other node's report (its nettest)
	Seconds int    // per rail; 0 turns the tests off
	Timeout int    // mpib-nettest --timeout-s
	Host    string // the leader: where its nettest listens; the follower: the leader's host
	Port    int    // the doctor's port
	Env     []string
	Run     Runner
}

// step is one traffic test the leader announces; Index -1 ends the tests.
type step struct {
	Index   int    `json:"index"` // into the rails ComparePair returned
	Device  int    `json:"device"`
	Rail    string `json:"rail"`
	Port    int    `json:"port"`
	Seconds int    `json:"seconds"`
	Timeout int    `json:"timeout"`
	Skip    string `json:"skip,omitempty"`
}

// stepWait bounds a wait for the other side's result: both drivers' setup and data loop.
func (t Traffic) stepWait() time.Duration {
	return time.Duration(2*t.Timeout+t.Seconds+60) * time.Second
}

// skip is why no test runs at all, "" when they can.
func (t Traffic) skip() string {
	switch {
	case t.Seconds <= 0:
		return "traffic test off (--bw-seconds 0)"
	case t.Nettest.Path == "":
		return "no mpib-nettest on " + t.Node + ": " + t.Nettest.Why
	case t.Peer.Nettest.Path == "":
		return "no mpib-nettest on " + t.Peer.Node + ": " + t.Peer.Nettest.Why
	}
	return ""
}

// Lead runs the tests as the listener.
func (t Traffic) Lead(ctx context.Context, rails []PairRail) error {
	s, k := t.Session, 0
	for i := range rails {
		if !rails[i].test {
			continue
		}
		k++
		st := step{Index: i, Device: rails[i].Device, Rail: rails[i].Rail, Port: t.Port + k, Seconds: t.Seconds,
			Timeout: t.Timeout, Skip: t.skip()}
		if err := s.write(st, s.timeout); err != nil {
			return fmt.Errorf("step %d: %w", k, err)
		}
		srv := Result{Skipped: true, Why: st.Skip, Mbps: -1}
		if st.Skip == "" {
			srv = t.Run(ctx, t.Nettest, t.run(st, "server", t.Host), t.Env)
		}
		var cli Result
		if err := s.read(&cli, t.stepWait()); err != nil {
			return fmt.Errorf("step %d: the peer's result: %w", k, err)
		}
		m := Merge(srv, cli)
		if err := s.write(m, s.timeout); err != nil {
			return fmt.Errorf("step %d: %w", k, err)
		}
		rails[i].Apply(m)
	}
	return s.write(step{Index: -1}, s.timeout)
}

// Follow runs the tests as the peer.
func (t Traffic) Follow(ctx context.Context, rails []PairRail) error {
	s := t.Session
	for {
		var st step
		if err := s.read(&st, s.timeout+t.stepWait()); err != nil {
			return fmt.Errorf("waiting for a step: %w", err)
		}
		if st.Index < 0 {
			return nil
		}
		if st.Index >= len(rails) || rails[st.Index].Device != st.Device || rails[st.Index].Rail != st.Rail {
			return fmt.Errorf("the listener's step %d (device %d %s) is not one of our rails: are both doctors one release?", st.Index, st.Device, st.Rail)
		}
		cli := Result{Skipped: true, Why: st.Skip, Mbps: -1}
		if st.Skip == "" {
			cli = t.Run(ctx, t.Nettest, t.run(st, "client", t.Host), t.Env)
		}
		if err := s.write(cli, s.timeout); err != nil {
			return err
		}
		var m Result
		if err := s.read(&m, t.stepWait()); err != nil {
			return fmt.Errorf("step %d: the merged result: %w", st.Index, err)
		}
		rails[st.Index].Apply(m)
	}
}

func (t Traffic) run(st step, role, host string) NettestRun {
	if role == "server" && host == "" {
		host = "0.0.0.0"
	}
	return NettestRun{Role: role, Connect: net.JoinHostPort(host, strconv.Itoa(st.Port)), Device: st.Device,
		Rail: st.Rail, Seconds: st.Seconds, Timeout: st.Timeout}
}

// SkipAll marks every rail whose planned test has not run as not measured, with why (the
// exchange failed before or during the tests).
func SkipAll(rails []PairRail, why string) {
	for i := range rails {
		if rails[i].test && rails[i].Reachable == "unknown" && rails[i].Why == "" {
			rails[i].Apply(Result{Skipped: true, Why: why, Mbps: -1})
		}
	}
}

// TrafficProblems are the rails whose traffic test ran and failed: the plugin could not move
// verified data there although both ends looked right. A rail that could not be tested, or
// that a problem of its own already explains, adds none.
func TrafficProblems(rails []PairRail) []Problem {
	var out []Problem
	for _, pr := range rails {
		if !pr.test || pr.Reachable != "false" {
			continue
		}
		out = append(out, Problem{Kind: KindTraffic, Device: pr.Device, Rail: pr.Rail, Facts: []string{"pair=" + pr.Pair},
			Want: "verified data through the plugin on the rail", Fix: pr.Why})
	}
	return out
}
