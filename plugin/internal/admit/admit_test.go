package admit

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

var (
	srcA = netip.MustParseAddr("10.0.0.1")
	srcB = netip.MustParseAddr("10.0.0.2")
)

func TestDisplace(t *testing.T) {
	lim := Limits{Process: 4, PerSource: 3, PerListener: 2}
	c := func(src netip.Addr, l uint64) Client { return Client{Src: src, Listener: l} }
	for _, tc := range []struct {
		name     string
		clients  []Client
		sent     []int // indexes that have sent bytes
		src      netip.Addr
		listener uint64
		want     []int
		ok       bool
	}{
		{"room everywhere", []Client{c(srcA, 1)}, nil, srcB, 2, nil, true},
		{"listener full: its oldest silent goes", []Client{c(srcA, 1), c(srcB, 1)}, nil, srcB, 1, []int{0}, true},
		{"listener full: a client with bytes stays", []Client{c(srcA, 1), c(srcB, 1)}, []int{0}, srcB, 1, []int{1}, true},
		{"listener full of clients with bytes: refused", []Client{c(srcA, 1), c(srcB, 1)}, []int{0, 1}, srcB, 1, nil, false},
		{"source full: the source's oldest silent goes, not another source's",
			[]Client{c(srcB, 3), c(srcA, 1), c(srcA, 2), c(srcA, 3)}, nil, srcA, 4, []int{1}, true},
		{"source full of clients with bytes: refused", []Client{c(srcA, 1), c(srcA, 2), c(srcA, 3)}, []int{0, 1, 2}, srcA, 4, nil, false},
		{"process full: the oldest silent anywhere", []Client{c(srcA, 1), c(srcB, 2), c(srcA, 3), c(srcB, 4)}, []int{0}, srcB, 5, []int{1}, true},
		{"process full of clients with bytes: refused", []Client{c(srcA, 1), c(srcB, 2), c(srcA, 3), c(srcB, 4)}, []int{0, 1, 2, 3}, netip.MustParseAddr("10.0.0.3"), 5, nil, false},
		{"one victim serves the listener, source and process limits",
			[]Client{c(srcA, 1), c(srcA, 1), c(srcA, 2), c(srcB, 3)}, nil, srcA, 1, []int{0}, true},
		{"the listener's victim is another source's: the source needs its own",
			[]Client{c(srcB, 1), c(srcA, 1), c(srcA, 2), c(srcA, 3)}, []int{1}, srcA, 1, []int{0, 2}, true},
		{"no limits", []Client{c(srcA, 1), c(srcA, 1)}, nil, srcA, 1, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := lim
			if tc.name == "no limits" {
				l = Limits{}
			}
			asked := map[int]int{}
			got, ok := Displace(tc.clients, tc.src, tc.listener, l, func(i int) bool {
				asked[i]++
				return slices.Contains(tc.sent, i)
			})
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Errorf("expected %v %v but got %v %v", tc.want, tc.ok, got, ok)
			}
			for i, n := range asked {
				if n > 1 {
					t.Errorf("sent(%d) asked %d times, want at most once", i, n)
				}
			}
		})
	}
}

// The predicate is asked oldest first and no further than needed: each answer costs a syscall.
func TestDisplaceAsksLazily(t *testing.T) {
	clients := make([]Client, 256)
	for i := range clients {
		clients[i] = Client{Src: srcA, Listener: uint64(i % 8)}
	}
	var asked []int
	got, ok := Displace(clients, srcB, 9, Limits{Process: 256, PerSource: 64, PerListener: 32}, func(i int) bool {
		asked = append(asked, i)
		return false
	})
	if !ok || !slices.Equal(got, []int{0}) || !slices.Equal(asked, []int{0}) {
		t.Errorf("expected victim [0] after asking [0] but got %v (ok %v) after asking %v", got, ok, asked)
	}
}

// One address cannot pin a listener with partial hellos: on the full listener a newer client
// (a real peer, from another address or the same one) displaces that address's oldest client
// beyond PerSourceListener, and a listener held by many addresses a few each stays full.
func TestOneSourceCannotPinAListener(t *testing.T) {
	lim := Limits{Process: 256, PerSource: 64, PerListener: 32, PerSourceListener: 4}
	sent := func(int) bool { return true }
	pinned := make([]Client, 32)
	for i := range pinned {
		pinned[i] = Client{Src: srcA, Listener: 7}
	}
	for _, peer := range []netip.Addr{srcB, srcA} {
		got, ok := Displace(pinned, peer, 7, lim, sent)
		if !ok || !slices.Equal(got, []int{0}) {
			t.Errorf("a peer from %v on a listener one address fills with partial hellos: displaces %v (ok %v), want [0]", peer, got, ok)
		}
	}
	if _, ok := Displace(pinned, srcB, 7, Limits{Process: 256, PerSource: 64, PerListener: 32}, sent); ok {
		t.Error("without PerSourceListener the 32 partial hellos of one address should hold the listener")
	}
	var spread []Client
	for i := range 32 { // eight addresses, four partial hellos each
		spread = append(spread, Client{Src: netip.AddrFrom4([4]byte{10, 0, 9, byte(i % 8)}), Listener: 7})
	}
	if got, ok := Displace(spread, srcB, 7, lim, sent); ok {
		t.Errorf("eight addresses with four partial hellos each: displaced %v; a client that has sent bytes stays", got)
	}
	other := append(append([]Client{}, pinned[:8]...), Client{Src: srcA, Listener: 8})
	if got, ok := Displace(other, srcB, 8, lim, sent); !ok || len(got) != 0 {
		t.Errorf("a listener with room displaces nothing: %v %v", got, ok)
	}
}

func TestDeadline(t *testing.T) {
	for _, tc := range []struct {
		sent        int
		grace, full time.Duration
		want        time.Duration
	}{
		{0, 10 * time.Second, 30 * time.Second, 10 * time.Second},
		{1, 10 * time.Second, 30 * time.Second, 30 * time.Second},
		{27, 10 * time.Second, 30 * time.Second, 30 * time.Second},
		{0, 10 * time.Second, 5 * time.Second, 5 * time.Second}, // a handshake timeout below the grace
	} {
		if got := Deadline(tc.sent, tc.grace, tc.full); got != tc.want {
			t.Errorf("Deadline(%d, %v, %v): expected %v but got %v", tc.sent, tc.grace, tc.full, tc.want, got)
		}
	}
}

func TestRedial(t *testing.T) {
	r := Redials{Step: 100 * time.Millisecond, Max: 34}
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		n      int
		left   time.Duration
		jitter float64
		want   time.Duration
		ok     bool
	}{
		{"the first redial, least jitter: half a step", 1, time.Minute, 0, 50 * ms, true},
		{"the first redial, most jitter: a step", 1, time.Minute, 1, 100 * ms, true},
		{"the pause grows with each redial", 10, time.Minute, 0.5, 750 * ms, true},
		{"the last redial allowed", 34, time.Minute, 0, 1700 * ms, true},
		{"past the bound: give up", 35, time.Minute, 0, 0, false},
		{"the pause would reach the deadline: give up", 10, 500 * ms, 0, 0, false},
		{"the pause just fits before the deadline", 10, 501 * ms, 0, 500 * ms, true},
		{"no time left", 1, 0, 0, 0, false},
		{"n below 1 counts as the first", 0, time.Minute, 0, 50 * ms, true},
		{"jitter out of range is clamped", 2, time.Minute, 7, 200 * ms, true},
		{"negative jitter is clamped", 2, time.Minute, -3, 100 * ms, true},
		{"no redials allowed", 1, time.Minute, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := r
			if tc.name == "no redials allowed" {
				pol.Max = 0
			}
			got, ok := Redial(tc.n, tc.left, tc.jitter, pol)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Redial(%d, %v, %v): expected %v %v but got %v %v", tc.n, tc.left, tc.jitter, tc.want, tc.ok, got, ok)
			}
		})
	}
}
