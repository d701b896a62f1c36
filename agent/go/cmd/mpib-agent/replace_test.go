package main

import (
	"path/filepath"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// replaceSegment re-creates fx's segment at its path (`create --force`), follows it with
// fx.seg and registers the fixture's connections there again, as plugins do: each gets gen 1,
// and fx.b the slot and gen it had in the old segment. The old registrations stay (a plugin
// releases them only after registering anew), so that a loop still reading the old segment
// sees its connections until it follows.
func replaceSegment(t *testing.T, fx *fixture) {
	t.Helper()
	n, err := shm.Create(fx.path, 8, 4, true)
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if moved, err := fx.seg.Reattach(); !moved || err != nil {
		t.Fatalf("reattach: %v %v", moved, err)
	}
	fx.plug = attachPlugin(t, fx.path)
	reg := func(conn uint64, peer string, class shm.PathClass, send bool) uint32 {
		ip, _ := shm.ParseIPv4(peer)
		local, _ := shm.ParseIPv4("10.0.1.1")
		s, err := fx.plug.Register(emulate.ConnDesc{LocalSoutIP: local, PeerSoutIP: ip, PeerIsland: ip & 0xFFFFFF00,
			PathClass: class, IsSend: send, NQPsSout: 1, NQPsSup: 2, PID: 4242, ConnID: conn})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fx.a = reg(1, "10.0.2.7", shm.InterIsland, true)
	fx.b = reg(2, "10.0.1.5", shm.IntraIsland, true)
	reg(3, "10.0.2.8", shm.InterIsland, false)
}

// TestCLIsRewriteAfterReplace: a policy loop (`run`, both CLIs, every policy) whose segment is
// re-created at its path follows it and writes its hints there again: class and peer defaults
// and conns entries (static), each send connection's split (closed-loop, proportional), also
// for a connection whose slot and gen are the same as in the old segment. The two CLIs must
// leave the same segment.
func TestCLIsRewriteAfterReplace(t *testing.T) {
	goCLI := cli{"go", []string{agentBin(t)}, nil}
	pyCLI := pythonCLI(t)
	dir := t.TempDir()
	env := []string{"MPIB_AGENT_STALE_MS=400"} // beat every 100 ms: a replaced segment is followed within 250 ms
	weights := filepath.Join(dir, "w.json")
	writeAt(t, weights, `{"class":{"inter":300},"peers":{"10.0.1.0/24":200},"conns":{"4242:2":700}}`, 1)
	for _, policy := range []string{"static", "closed-loop", "proportional"} {
		t.Run(policy, func(t *testing.T) {
			var states [2]string
			for j, c := range []cli{goCLI, pyCLI} {
				fx := newFixture(t, dir, policy+"-"+c.name)
				args := []string{"run", "--policy", policy, "--interval", "50ms", "--path", fx.path}
				if policy == "static" {
					args = append(args, "--file", weights)
				}
				_, e, code := runLoop(t, c, env, fx, args, func(int) { replaceSegment(t, fx) }, 1)
				if code != 0 {
					t.Fatalf("%s: exit %d\nstderr: %s", c.name, code, e)
				}
				checkRewritten(t, c.name, policy, fx)
				states[j] = fx.state(t)
			}
			if states[0] != states[1] {
				t.Errorf("resulting segment differs:\n--- go\n%s\n--- python\n%s", states[0], states[1])
			}
		})
	}
}

// checkRewritten requires the hints policy writes in fx's (new) segment.
func checkRewritten(t *testing.T, who, policy string, fx *fixture) {
	t.Helper()
	snap, err := fx.seg.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	want := map[uint32]uint32{fx.a: 512, fx.b: 512} // closed-loop and proportional: the start split
	if policy == "static" {
		want = map[uint32]uint32{fx.b: 700}
		if r := snap.Class[shm.InterIsland]; !r.Valid() || r.SupBw != 300 {
			t.Errorf("%s: class inter default not written again: %+v", who, r)
		}
		if len(snap.Peers) == 0 || !snap.Peers[0].Record.Valid() || snap.Peers[0].Record.SupBw != 200 {
			t.Errorf("%s: peer default not written again: %+v", who, snap.Peers)
		}
	}
	for slot, bw := range want {
		sl, err := fx.seg.Slot(slot)
		if err != nil {
			t.Fatal(err)
		}
		if !sl.Hint.Valid() || sl.Hint.SupBw != bw || sl.Hint.Gen != sl.Gen {
			t.Errorf("%s: slot %d (gen %d) hint not written again: %+v, want sup_bw %d", who, slot, sl.Gen, sl.Hint, bw)
		}
	}
}
