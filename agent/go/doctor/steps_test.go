package doctor

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRuns records the traffic tests a side was asked to run and answers from a table.
type fakeRuns struct {
	mu   sync.Mutex
	runs []NettestRun
	res  map[string]Result // by role + "/" + rail
}

func (f *fakeRuns) run(_ context.Context, _ Nettest, r NettestRun, _ []string) Result {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs = append(f.runs, r)
	return f.res[r.Role+"/"+r.Rail]
}

func pipeSessions() (*Session, *Session) {
	c1, c2 := net.Pipe()
	return &Session{conn: c1, r: bufio.NewReader(c1), timeout: 2 * time.Second},
		&Session{conn: c2, r: bufio.NewReader(c2), timeout: 2 * time.Second}
}

// runTraffic runs Lead and Follow against each other over a pipe, each on its own copy of
// the rails, and returns both copies.
func runTraffic(t *testing.T, lead, follow Traffic, rails []PairRail) (led, followed []PairRail) {
	t.Helper()
	led, followed = append([]PairRail{}, rails...), append([]PairRail{}, rails...)
	ls, fs := pipeSessions()
	lead.Session, follow.Session = ls, fs
	errc := make(chan error, 1)
	go func() { errc <- lead.Lead(context.Background(), led) }()
	if err := follow.Follow(context.Background(), followed); err != nil {
		t.Fatalf("Follow: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Lead: %v", err)
	}
	return led, followed
}

func TestTrafficSteps(t *testing.T) {
	a1, a2, _ := labPair(t)
	a1.Nettest, a2.Nettest = Nettest{Path: "/opt/mpib/mpib-nettest"}, Nettest{Path: "/opt/mpib/mpib-nettest"}
	rails, _ := ComparePair(a1, a2)
	srv := &fakeRuns{res: map[string]Result{
		"server/SOUT": {Verified: true, Mbps: 900}, "server/SUP": {Verified: true, Mbps: 950}}}
	cli := &fakeRuns{res: map[string]Result{
		"client/SOUT": {Verified: true, Mbps: 890}, "client/SUP": {Exit: 1, Mbps: -1, Why: "mpib-nettest: side channel: refused"}}}
	lead := Traffic{Node: "a1", Nettest: a1.Nettest, Peer: a2, Seconds: 2, Timeout: 5, Host: "", Port: 18600, Run: srv.run}
	follow := Traffic{Node: "a2", Nettest: a2.Nettest, Peer: a1, Seconds: 2, Timeout: 5, Host: "10.0.1.11", Port: 18600, Run: cli.run}
	led, followed := runTraffic(t, lead, follow, rails)
	for _, side := range [][]PairRail{led, followed} {
		out := pairOutput(side, nil)
		for _, want := range []string{
			"rail=SOUT class=intra-island used=false path=direct mtu=4096/4096 reachable=true mbps=900.0",
			"rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=false mbps=950.0 speed_mbps=200000 why=client:_mpib-nettest:_side_channel:_refused",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("no line with\n%s\nin\n%s", want, out)
			}
		}
	}
	if ps := TrafficProblems(led); len(ps) != 1 || ProblemLine(ps[0]) != "doctor: problem=traffic device=0 rail=SUP pair=a1-a2 want=verified data through the plugin on the rail: client: mpib-nettest: side channel: refused" {
		t.Errorf("traffic problems %+v", ps)
	}
	want := []NettestRun{
		{Role: "server", Connect: "0.0.0.0:18601", Device: 0, Rail: "SOUT", Seconds: 2, Timeout: 5},
		{Role: "server", Connect: "0.0.0.0:18602", Device: 0, Rail: "SUP", Seconds: 2, Timeout: 5},
	}
	if len(srv.runs) != 2 || srv.runs[0] != want[0] || srv.runs[1] != want[1] {
		t.Errorf("server runs %+v, want %+v", srv.runs, want)
	}
	if len(cli.runs) != 2 || cli.runs[0].Connect != "10.0.1.11:18601" || cli.runs[1].Connect != "10.0.1.11:18602" || cli.runs[1].Role != "client" {
		t.Errorf("client runs %+v", cli.runs)
	}
}

func TestTrafficSkipped(t *testing.T) {
	a1, a2, _ := labPair(t)
	a1.Nettest = Nettest{Path: "/x/mpib-nettest"}
	a2.Nettest = Nettest{Why: "no mpib-nettest beside /usr/bin/mpib-agent or on PATH"}
	rails, _ := ComparePair(a1, a2)
	runs := &fakeRuns{}
	lead := Traffic{Node: "a1", Nettest: a1.Nettest, Peer: a2, Seconds: 2, Timeout: 5, Port: 1, Run: runs.run}
	follow := Traffic{Node: "a2", Nettest: a2.Nettest, Peer: a1, Seconds: 2, Timeout: 5, Run: runs.run}
	led, followed := runTraffic(t, lead, follow, rails)
	for _, side := range [][]PairRail{led, followed} {
		for _, pr := range side {
			if pr.Reachable != "unknown" || !strings.HasPrefix(pr.Why, "no mpib-nettest on a2: no mpib-nettest beside") {
				t.Errorf("%s: reachable=%s why=%q, want unknown with the reason", pr.Rail, pr.Reachable, pr.Why)
			}
		}
	}
	if len(runs.runs) != 0 {
		t.Errorf("nettest ran: %+v", runs.runs)
	}
	off := Traffic{Seconds: 0, Nettest: a1.Nettest, Peer: a1}
	if got := off.skip(); got != "traffic test off (--bw-seconds 0)" {
		t.Errorf("skip with --bw-seconds 0: %q", got)
	}
}

// A follower whose listener vanishes mid-test ends with an error, not a hang.
func TestFollowListenerGone(t *testing.T) {
	a1, a2, _ := labPair(t)
	rails, _ := ComparePair(a1, a2)
	ls, fs := pipeSessions()
	ls.Close()
	follow := Traffic{Session: fs, Seconds: 1, Timeout: 1, Run: (&fakeRuns{}).run}
	if err := follow.Follow(context.Background(), rails); err == nil {
		t.Fatal("Follow with the listener gone succeeded")
	}
	SkipAll(rails, "traffic tests stopped: gone")
	for _, pr := range rails {
		if pr.test && (pr.Reachable != "unknown" || pr.Why != "traffic tests stopped: gone") {
			t.Errorf("%s after SkipAll: %s %q", pr.Rail, pr.Reachable, pr.Why)
		}
	}
}
