package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The demo (go run mage.go demo): traffic between and inside the islands in vanilla mode,
// then advanced mode with the Go agent moving the a1->a2 split live, then a1's SUP link cut
// and brought back while a1->a2 runs (the failover to SOUT and the return), while a1's
// per-rail throughput is shown every second. Runs only with MPIB_DEMO=1; the timeline goes to
// $MPIB_DEMO_OUT/timeline.json for the chart (samples carry the events: the cut, the
// failover, the link's return and the rail back in service).

type demoSample struct {
	T       float64 `json:"t"`
	Phase   string  `json:"phase"`
	Hint    int     `json:"hint"`
	SoutBps float64 `json:"sout_mbps"`
	SupBps  float64 `json:"sup_mbps"`
	Event   string  `json:"event,omitempty"`
}

// demoEvent is a moment of the failover phase, in the test's clock (seconds from the start).
type demoEvent struct {
	t    float64
	what string
}

func TestDemo(t *testing.T) {
	if os.Getenv("MPIB_DEMO") != "1" {
		t.Skip("the demo runs with MPIB_DEMO=1 (go run mage.go demo)")
	}
	lab := labOrSkip(t)
	a1, a2, b1 := lab.Node("a1"), lab.Node("a2"), lab.Node("b1")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	var timeline []demoSample
	phase, hint := "", -1

	// watch prints a1's per-rail transmit rate once a second until stop is closed.
	watchDone := make(chan struct{})
	watch := func(stop <-chan struct{}) {
		defer close(watchDone)
		prevSout, prevSup, _ := readRailTx(ctx, a1)
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			sout, sup, err := readRailTx(ctx, a1)
			if err != nil {
				continue
			}
			dt := time.Since(last).Seconds()
			last = time.Now()
			s := demoSample{T: time.Since(start).Seconds(), Phase: phase, Hint: hint,
				SoutBps: float64(sout-prevSout) * 8 / dt / 1e6, SupBps: float64(sup-prevSup) * 8 / dt / 1e6}
			prevSout, prevSup = sout, sup
			timeline = append(timeline, s)
			hintText := "vanilla"
			if s.Hint >= 0 {
				hintText = fmt.Sprintf("hint=%d/1024", s.Hint)
			}
			evidence("demo:", "t=%5.1fs %-9s %-14s a1 tx  SOUT %6.1f Mbit/s %-22s SUP %6.1f Mbit/s %s", s.T, s.Phase, hintText,
				s.SoutBps, bar(s.SoutBps), s.SupBps, bar(s.SupBps))
		}
	}
	bw := func(server, client *Node, env []string, seconds int) (*Process, *Process) {
		return startPair(ctx, t, nettestPair{server: server, client: client, serverEnv: pluginEnv(server, env...), clientEnv: pluginEnv(client, env...),
			args: []string{"--timeout-s", "120", "--mode", "bw", "--sizes", "1048576", "--seconds", strconv.Itoa(seconds)}})
	}
	waitAll := func(ps ...*Process) {
		for _, p := range ps {
			if _, errOut, code, err := p.Wait(ctx); err != nil || code != 0 {
				t.Fatalf("demo transfer failed: exit %d %v\n%s", code, err, tail(errOut, 2000))
			}
		}
	}

	evidence("demo:", "phase 1, vanilla (MPIB_MODE=0): a1->a2 inside island A rides SUP, a1->b1 to island B rides SOUT")
	phase = "vanilla"
	stop := make(chan struct{})
	go watch(stop)
	stopped := false
	stopWatch := func() {
		if !stopped {
			stopped = true
			close(stop)
			<-watchDone
		}
	}
	defer stopWatch()
	s1, c1 := bw(a2, a1, nil, 20)
	s2, c2 := bw(b1, a1, nil, 20)
	waitAll(c1, c2, s1, s2)

	evidence("demo:", "phase 2, advanced (MPIB_MODE=1): the Go agent in a1 moves the a1->a2 split live")
	phase = "advanced"
	a1.Exec(ctx, nil, "rm", "-f", segPath)
	goAgent.run(ctx, t, a1, "create")
	beat, err := a1.Start(ctx, nil, goAgent.cmd[0], "heartbeat", "--path", segPath)
	if err != nil {
		t.Fatal(err)
	}
	mode := []string{"MPIB_MODE=1", "MPIB_SHM_PATH=" + segPath}
	// Long enough for the five hints below plus the agent CLI's seconds per call.
	s3, c3 := bw(a2, a1, mode, 50)
	slot := goAgent.sendSlot(ctx, t, a1)
	for _, h := range []int{0, 256, 512, 768, 1024} {
		goAgent.run(ctx, t, a1, "set", "--conn", strconv.Itoa(int(slot)), "--sup-bw", strconv.Itoa(h))
		hint = h
		time.Sleep(6 * time.Second)
	}
	waitAll(c3, s3)
	beat.Kill(ctx)

	evidence("demo:", "phase 3, failover (MPIB_MODE=0): a1's SUP link is cut while a1->a2 runs, and comes back")
	phase, hint = "failover", -1
	events := demoFailover(ctx, t, a1, a2, start, bw)
	stopWatch()
	for _, e := range events {
		for i := range timeline {
			if timeline[i].T >= e.t {
				timeline[i].Event = strings.TrimSpace(timeline[i].Event + " " + e.what)
				break
			}
		}
	}

	if dir := os.Getenv("MPIB_DEMO_OUT"); dir != "" {
		b, _ := json.MarshalIndent(timeline, "", "  ")
		if err := os.WriteFile(filepath.Join(dir, "timeline.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// demoFailover cuts a1's SUP link 8 s into a vanilla a1->a2 transfer and brings it back 8 s
// later; the failover and the recovery come from the plugin's own lines (their unix ms, mapped
// to the test's clock through the node's clock read at the cut).
func demoFailover(ctx context.Context, t *testing.T, a1, a2 *Node, start time.Time,
	bw func(server, client *Node, env []string, seconds int) (*Process, *Process)) []demoEvent {
	s, c := bw(a2, a1, []string{"MPIB_FAILOVER=1"}, 28)
	time.Sleep(8 * time.Second)
	host := time.Now()
	node, err := nodeStamp(ctx, a1, linkDownCmd(a1, SUP))
	if err != nil {
		t.Fatalf("cutting SUP: %v", err)
	}
	at := func(nodeMS int64) float64 { return host.Sub(start).Seconds() + float64(nodeMS-node)/1000 }
	events := []demoEvent{{at(node), "SUP cut"}}
	evidence("demo:", "t=%5.1fs SUP cut (a1's SUP link down)", events[0].t)
	time.Sleep(8 * time.Second)
	back, err := nodeStamp(ctx, a1, "ip link set dev "+a1.Netdev(SUP)+" up")
	if err != nil {
		t.Fatalf("restoring SUP: %v", err)
	}
	events = append(events, demoEvent{at(back), "SUP back"})
	evidence("demo:", "t=%5.1fs SUP link up again", at(back))
	_, errOut, code, err := c.Wait(ctx)
	if err != nil || code != 0 {
		t.Fatalf("demo failover transfer failed: exit %d %v\n%s", code, err, tail(errOut, 2000))
	}
	if _, _, code, err := s.Wait(ctx); err != nil || code != 0 {
		t.Fatalf("demo failover receiver failed: exit %d %v", code, err)
	}
	for _, e := range parseRailEvents("a1", errOut) {
		if e.side != "send" || e.rail != SUP {
			continue
		}
		what := "failover to " + e.continued
		if e.kind == "recovery" {
			what = "SUP in service"
		}
		events = append(events, demoEvent{at(e.ms), what})
		evidence("demo:", "t=%5.1fs %s (the plugin's %s line)", at(e.ms), what, e.kind)
	}
	return events
}

func bar(mbps float64) string {
	n := int(mbps / 10)
	if n > 20 {
		n = 20
	}
	if n < 0 {
		n = 0
	}
	return "[" + string([]byte("####################")[:n]) + string([]byte("                    ")[:20-n]) + "]"
}
