package integration

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/kv"
	"github.com/mpib/mpib/internal/lab"
)

// Hostile inputs on real soft-RoCE (docs/security.md): what a stray or hostile party on the
// network, or a hostile peer rank, can send must not stop a job or corrupt its data.

// hostileLib is the plugin's hostile test build, with test-only misbehaviour that
// MPIB_TEST_HOSTILE turns on (plugin/hostile_on.go, plugin/mpib_hostile.c); the plugin under
// test is always the ordinary build (pluginLib). `go run mage.go test:integration` (and
// `test`) build it into build/test-only/, never `build`, so that it cannot be copied beside the
// product (magefile.go, hostileTestPlugin).
const hostileLib = NodeBuildDir + "/" + hostileLibRel

const hostileLibRel = "test-only/libnccl-net-mpib-hostile-test-only.so"

// needHostileLib fails the test when the hostile test build is missing on the host.
func needHostileLib(t *testing.T) {
	t.Helper()
	root, err := lab.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "build", hostileLibRel)); err != nil {
		t.Fatalf("%v: the hostile test build is missing: go run mage.go test:integration builds it", err)
	}
}

// runHostilePair runs a nettest pair (the client sends) where one side may load the test build.
func runHostilePair(t *testing.T, p nettestPair) pairResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p.args = append([]string{"--timeout-s", "30"}, p.args...)
	srv, cli := startPair(ctx, t, p)
	return waitPair(ctx, t, srv, cli, "nettest")
}

// runAttackingSender runs a verify pair a2 -> a1 whose sender is the test build making the
// attack MPIB_TEST_HOSTILE names; the receiver is the plugin under test.
func runAttackingSender(t *testing.T, attack string) pairResult {
	t.Helper()
	lab := labOrSkip(t)
	needHostileLib(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	return runHostilePair(t, nettestPair{server: a1, client: a2, serverEnv: pluginEnv(a1),
		clientEnv: pluginEnv(a2, "MPIB_TEST_HOSTILE="+attack), clientLib: hostileLib,
		args: []string{"--count", "20", "--max-size", "1M"}})
}

// TestHostileListenerFlood: the server's descriptor limit lowered to 24 above what it holds,
// the client floods its listen port with TCP clients (idle, junk, closed at once, zeros:
// thousands) and connects for real in the middle of the flood. The real handshake must
// complete, the accept loop must survive running out of descriptors, the descriptors must come
// back, and a replay of the same handle's hello must be refused.
func TestHostileListenerFlood(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	res := runPair(context.Background(), t, a1, a2, pluginEnv(a1), pluginEnv(a2), lcArgs("--mode", "listener-flood", "--max-size", "1M")...)
	const sp, cp = "nettest-hostile: case=listener-flood role=server", "nettest-hostile: case=listener-flood role=client"
	clients := atoiOr(kv.Field(res.clientOut, cp, "clients"), 0)
	start, peak, end := atoiOr(kv.Field(res.serverOut, sp, "fds_start"), -1), atoiOr(kv.Field(res.serverOut, sp, "fds_peak"), -1), atoiOr(kv.Field(res.serverOut, sp, "fds_end"), -1)
	limit := atoiOr(kv.Field(res.serverOut, sp, "fd_limit"), -1)
	connected := kv.Field(res.clientOut, cp, "connected") == "true" && kv.Field(res.serverOut, sp, "connected") == "true"
	// The accept loop ran out of descriptors (EMFILE) and went on: it logs the shortage once,
	// and the real peer connected after it.
	shortage := strings.Contains(res.serverErr, "backing off; the listener stays up")
	alive := connected && shortage
	refused := strings.Contains(res.serverErr, "used already") && kv.Field(res.clientOut, cp, "replayed_hello_refused") == "true"
	m := resultRe.FindStringSubmatch(res.serverOut)
	verifiedOK := m != nil && m[4] == "true"
	evidence("hostile:", "case=listener-flood clients=%d fds_peak=%d accept_loop_alive=%v real_peer_connected=%v connect_ms=%s fd_limit=%d fds_start=%d fds_end=%d replayed_hello_refused=%v verified=%v",
		clients, peak, alive, connected, kv.Field(res.clientOut, cp, "connect_ms"), limit, start, end, refused, verifiedOK)
	if clients < 1000 {
		t.Errorf("the flood opened %d TCP clients, want thousands (>= 1000):\n%s", clients, res)
	}
	if !connected || !verifiedOK || res.serverCode != 0 || res.clientCode != 0 {
		t.Fatalf("the real peer did not connect and verify during the flood:\n%s", res)
	}
	if !shortage {
		t.Errorf("the flood never ran the listener out of descriptors (fd_limit %d, peak %d): the case tested less than it says:\n%s", limit, peak, res)
	}
	if peak > limit {
		t.Errorf("descriptor peak %d above the limit %d", peak, limit)
	}
	if end > start {
		t.Errorf("descriptors did not come back after the flood: %d at the start, %d at the end", start, end)
	}
	if !refused {
		t.Errorf("a second valid hello for the served listener was not refused with a message:\n%s", res)
	}
}

// TestHostileForgedHandle: while its honest connect's comm waits to be collected, the client
// calls connect with handles of another listener carrying the honest handle's attempt id and
// pending entry (exact, then 63 variations): none may collect a comm, and the honest connect
// must still get its own and verify.
func TestHostileForgedHandle(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	res := runPair(context.Background(), t, a1, a2, pluginEnv(a1), pluginEnv(a2), lcArgs("--mode", "forged-handle", "--max-size", "1M")...)
	const cp = "nettest-hostile: case=forged-handle role=client"
	guessed, collected := atoiOr(kv.Field(res.clientOut, cp, "guessed"), 0), atoiOr(kv.Field(res.clientOut, cp, "collected_other"), -1)
	m := resultRe.FindStringSubmatch(res.serverOut)
	verifiedOK := m != nil && m[4] == "true"
	honest := strings.Contains(res.clientOut, "honest_connected=true")
	evidence("hostile:", "case=forged-handle guessed=%d collected_other=%d refused=%s honest_connected=%v verified=%v",
		guessed, collected, kv.Field(res.clientOut, cp, "refused"), honest, verifiedOK)
	if guessed == 0 || collected != 0 {
		t.Errorf("forged handles: guessed=%d collected_other=%d, want guesses and none collected:\n%s", guessed, collected, res)
	}
	if !honest || !verifiedOK || res.serverCode != 0 || res.clientCode != 0 {
		t.Errorf("the honest connection did not connect and verify after the forgeries:\n%s", res)
	}
}

// TestHostilePeerSizeOverwrite: a sender (the test build) writes a larger size into the
// receiver's own CTS copy and reports more bytes than the receiver posted. The receiver's
// plugin must never report more than was posted: it refuses the size (an error NCCL sees),
// and its CTS copy is not writable by the peer at all.
func TestHostilePeerSizeOverwrite(t *testing.T) {
	res := runAttackingSender(t, "size-overwrite")
	const sp = "nettest-sizes: role=server"
	reported, posted := atoiOr(kv.Field(res.serverOut, sp, "reported_bytes_max"), -2), atoiOr(kv.Field(res.serverOut, sp, "posted_bytes"), -1)
	attacked := strings.Contains(res.clientErr, "hostile-test: case=peer-size-overwrite")
	refusedMsg := strings.Contains(res.serverErr, "peer reported")
	evidence("hostile:", "case=peer-size-overwrite reported_bytes_max=%d posted_bytes=%d attacked=%v refused_with_message=%v server_code=%d",
		max(reported, 0), posted, attacked, refusedMsg, res.serverCode)
	if !attacked || posted <= 0 || reported == -2 {
		t.Fatalf("the attack did not run or the receiver printed no sizes (attacked=%v):\n%s", attacked, res)
	}
	if reported > posted {
		t.Errorf("the receiver's plugin reported %d bytes for a %d-byte receive: a peer's word became NCCL's size", reported, posted)
	}
	if !refusedMsg {
		t.Errorf("the receiver did not refuse the inflated size with a message:\n%s", res)
	}
}

var remoteReadRe = regexp.MustCompile(`hostile-test: case=remote-read rail=\w+ posted=\d status=(-?\d+) denied=(\w+)`)

// TestHostileRemoteRead: a sender (the test build) RDMA-reads the receiver's posted buffer
// with the rkey its CTS carries, through their data QP. The receiver's data QPs grant remote
// writes only, so the device must refuse the read.
func TestHostileRemoteRead(t *testing.T) {
	res := runAttackingSender(t, "remote-read")
	denied, status := "", ""
	if m := remoteReadRe.FindStringSubmatch(res.clientErr); m != nil {
		status, denied = m[1], m[2]
	}
	m := resultRe.FindStringSubmatch(res.serverOut)
	evidence("hostile:", "case=remote-read denied=%s wc_status=%s verified=%v", denied, status, m != nil && m[4] == "true")
	if denied != "true" {
		t.Errorf("the peer's RDMA READ of a registered buffer was not refused (denied=%q):\n%s", denied, res)
	}
}

// TestHostileGoPanic: the receiver (the test build, MPIB_TEST_HOSTILE=go-panic) panics in Go
// during the handshake. The plugin must turn it into an error NCCL's accept returns
// (ncclInternalError, 3), with a message, and the process must go on (the driver prints its
// verdict and exits by itself, not by a crash).
func TestHostileGoPanic(t *testing.T) {
	lab := labOrSkip(t)
	needHostileLib(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	res := runHostilePair(t, nettestPair{server: a1, client: a2, serverEnv: pluginEnv(a1, "MPIB_TEST_HOSTILE=go-panic"),
		clientEnv: pluginEnv(a2), serverLib: hostileLib, args: []string{"--count", "4"}})
	// connect or accept, whichever NCCL's loop calls first after the handshakes failed
	handshakeErr := strings.Contains(res.serverErr, "failed: rc=3") && strings.Contains(res.serverErr, "internal error in connection setup")
	// A panic that escaped ends the process from the Go runtime ("panic: ..." and a goroutine
	// dump, exit 2); the driver's own failure exit is 1.
	escaped := strings.Contains(res.serverErr, "\npanic: ") || strings.HasPrefix(res.serverErr, "panic: ")
	alive := res.serverCode == 1 && !escaped
	evidence("hostile:", "case=go-panic handshake_error=%v process_alive=%v server_code=%d client_code=%d",
		handshakeErr, alive, res.serverCode, res.clientCode)
	if !handshakeErr || !alive {
		t.Errorf("a Go panic in the handshake must fail it with ncclInternalError and a message, the process alive:\n%s", res)
	}
}

// silentHoldSeconds is how long TestHostileSilentHold's attacker holds its clients:
// MPIB_HOSTILE_HOLD_S, else 15 s. The full case holds 60 s; the default run keeps 15 s
// because the whole CI suite must stay under 40 minutes. The hold's
// length changes how often dropped clients are reopened, not the gate's decisions, which
// every real connect meets within the first seconds; run it with MPIB_HOSTILE_HOLD_S=60 for
// the full case.
func silentHoldSeconds() int {
	if s := os.Getenv("MPIB_HOSTILE_HOLD_S"); s != "" {
		if n := atoiOr(s, 0); n > 0 && n <= 600 {
			return n
		}
	}
	return 15
}

// TestHostileSilentHold: the server listens 8 times; an attacker on the client's node holds
// 32 silent TCP clients (connected, never a byte) on each listener and reopens every one the
// server drops, while the client connects for real to each listener in turn, spread over the
// hold. Before the gate (plugin/gate.go) the process's 256 unproven clients refused every new
// client at once, the real peer included. Every real connection must succeed, each within 10 s.
func TestHostileSilentHold(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	hold := silentHoldSeconds()
	res := runPair(context.Background(), t, a1, a2, pluginEnv(a1), pluginEnv(a2),
		lcArgs("--mode", "silent-hold", "--seconds", strconv.Itoa(hold))...)
	const sp, cp = "nettest-hostile: case=silent-hold role=server", "nettest-hostile: case=silent-hold role=client"
	listeners := atoiOr(kv.Field(res.clientOut, cp, "listeners"), 0)
	connected := atoiOr(kv.Field(res.clientOut, cp, "connected"), -1)
	accepted := atoiOr(kv.Field(res.serverOut, sp, "accepted"), -1)
	reopened := atoiOr(kv.Field(res.clientOut, cp, "reopened"), 0)
	heldS, _ := strconv.ParseFloat(kv.Field(res.clientOut, cp, "hold_s"), 64)
	connectMS := atoiOr(kv.Field(res.clientOut, cp, "connect_ms_max"), -1)
	realOK := listeners == 8 && connected == listeners && accepted == listeners && res.serverCode == 0 && res.clientCode == 0
	perS := 0.0
	if heldS > 0 {
		perS = float64(reopened) / heldS
	}
	evidence("hostile:", "case=silent-hold listeners=%d silent_clients=%s reconnects_per_s=%.1f hold_s=%d real_peer_connected=%v connect_ms=%d held_at_start=%s held_at_end=%s accepted=%d",
		listeners, kv.Field(res.clientOut, cp, "silent_clients"), perS, hold, realOK, connectMS,
		kv.Field(res.clientOut, cp, "held_at_start"), kv.Field(res.clientOut, cp, "held_at_end"), accepted)
	if !realOK {
		t.Fatalf("a real connection failed while silent clients held the listeners (connected %d, accepted %d of %d):\n%s",
			connected, accepted, listeners, res)
	}
	// The gate's failure is refusal (realOK above), not slowness: the bound only catches a
	// connect that crawls. The lab's slowest connect is CPU-bound in the VM, 1237 ms in a
	// recorded run beside the attacker's 250 reopens a second on two vCPUs, and a loaded 2-core
	// host has put 4.8 s between a peer's TCP handshake and its hello (docs/security.md), so
	// 10 s, twice that, not 5 s.
	if connectMS < 0 || connectMS > 10000 {
		t.Errorf("the slowest real connection took %d ms, want within 10000:\n%s", connectMS, res)
	}
	if held := atoiOr(kv.Field(res.clientOut, cp, "held_at_start"), 0); held < 8*32*3/4 {
		t.Errorf("the attacker held only %d silent clients before the first real connect, want about %d: the case tested less than it says", held, 8*32)
	}
}

// TestHostileEvictRace: 50 rounds, each on a fresh listener: a burst of 320 silent clients
// (above the listener's, the source's and the process's bounds) races the real peer's connect
// and hello, which starts 0..7 ms into the burst. Eviction may close only silent clients, never
// a client whose hello was read or waits in its socket, and the connector dials once more when
// closed before any metadata: every round's real connection must succeed.
func TestHostileEvictRace(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	const rounds = 50
	res := runPair(context.Background(), t, a1, a2, pluginEnv(a1), pluginEnv(a2),
		lcArgs("--mode", "evict-race", "--rounds", strconv.Itoa(rounds))...)
	const sp, cp = "nettest-hostile: case=evict-race role=server", "nettest-hostile: case=evict-race role=client"
	done := atoiOr(kv.Field(res.clientOut, cp, "rounds"), 0)
	connected := atoiOr(kv.Field(res.clientOut, cp, "connected"), -1)
	accepted := atoiOr(kv.Field(res.serverOut, sp, "accepted"), -1)
	realOK := done == rounds && connected == rounds && accepted == rounds && res.serverCode == 0 && res.clientCode == 0
	redials := strings.Count(res.clientErr, "dialing it once more")
	evidence("hostile:", "case=evict-race rounds=%d burst=%s failed=%d redials=%d connect_ms_max=%s real_peer_connected=%v",
		done, kv.Field(res.clientOut, cp, "burst"), rounds-max(connected, 0), redials, kv.Field(res.clientOut, cp, "connect_ms_max"), realOK)
	if !realOK {
		t.Fatalf("a real connection lost the race against a burst of silent clients (connected %d, accepted %d of %d rounds):\n%s",
			connected, accepted, rounds, res)
	}
}
