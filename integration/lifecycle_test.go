package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/kv"
)

// The plugin's lifecycle under what NCCL and applications do besides moving data: an abort
// during connection setup or mid-transfer, fork() while transfers are in flight, stray TCP
// clients on the listen port, and a rail device removed under traffic. Each test prints one
// fixed `lifecycle: case=...` line. Driver modes: docs/nettest.md "Lifecycle modes".

// TestLifecycleFinalizeDuringHandshake: the server starts 16 connects, calls finalize(ctx)
// before any completes and closes nothing (ncclCommAbort during init); the client then
// connects to the server's 16 listeners. The server must stay up and exit 0 by itself.
func TestLifecycleFinalizeDuringHandshake(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := "MPIB_HANDSHAKE_TIMEOUT_MS=10000"
	start := time.Now()
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2, env),
		clientEnv: pluginEnv(a1, env), args: lcArgs("--mode", "finalize-during-handshake", "--timeout-s", "30")})
	s, c := waitBoth(srv, cli, start.Add(2*time.Minute), start.Add(2*time.Minute))
	const sp, cp = "nettest-lifecycle: case=finalize-during-handshake role=server", "nettest-lifecycle: case=finalize-during-handshake role=client"
	inflight := kv.Field(s.out, sp, "inflight")
	if m := regexp.MustCompile(`with (\d+) of \d+ connects in flight`).FindStringSubmatch(s.err); inflight == "" && m != nil {
		inflight = m[1] // the server died after finalize, before its result line
	}
	evidence("lifecycle:", "case=finalize-during-handshake crashed=%v inflight=%s server_code=%d client_code=%d client_hung=%v client_exit_s=%.1f connect_ok=%s connect_errors=%s accept_ok=%s accept_errors=%s",
		s.crashed(), inflight, s.code, c.code, c.hung, c.at.Sub(start).Seconds(), kv.Field(c.out, cp, "connect_ok"),
		kv.Field(c.out, cp, "connect_errors"), kv.Field(c.out, cp, "accept_ok"), kv.Field(c.out, cp, "accept_errors"))
	if s.crashed() {
		t.Errorf("server did not exit 0 by itself after finalize with connects in flight:\n%s", s)
	}
	if n, err := strconv.Atoi(inflight); err != nil || n == 0 { // an error: it died before finalize
		t.Errorf("server reported inflight=%q: no connect was in flight at finalize, the case tested nothing:\n%s", inflight, s)
	}
	if c.signaled() {
		t.Errorf("client (connecting to a finalized peer) hung or died of a signal; it may fail but must exit:\n%s", c)
	}
}

// TestLifecycleAbortMidTransfer: one side closes its comms with requests in flight and
// finalizes, then lingers 2 s with the side channel open and silent. The peer does not watch
// the side channel during the transfer (its stall limit is 60 s), so only the plugin can end
// it: it must exit, with an error, within 10 s of the abort.
func TestLifecycleAbortMidTransfer(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	for _, side := range []string{"receiver", "sender"} {
		t.Run(side, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			start := time.Now()
			srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2), clientEnv: pluginEnv(a1),
				args: lcArgs("--mode", "abort-mid-transfer", "--abort-side", side, "--max-size", "1M", "--timeout-s", "60")})
			aborter, peer := srv, cli // the server receives
			if side == "sender" {
				aborter, peer = cli, srv
			}
			ab := waitExit(aborter, start.Add(3*time.Minute))
			pe := waitExit(peer, ab.at.Add(75*time.Second))
			checkAbort(t, side, ab, pe)
		})
	}
}

func checkAbort(t *testing.T, side string, ab, pe exitInfo) {
	t.Helper()
	const ap, pp = "nettest-lifecycle: case=abort-mid-transfer role=aborter", "nettest-lifecycle: case=abort-mid-transfer role=peer"
	abortAt, okA := kv.Float(ab.out, ap, "abort_mono")
	errAt, okE := kv.Float(pe.out, pp, "error_mono")
	exitAt, okX := kv.Float(pe.out, "nettest-lifecycle-exit:", "mono")
	ms := func(ok bool, t float64) int {
		if !ok || !okA {
			return -1
		}
		return int((t - abortAt) * 1000)
	}
	exitMS, errMS := ms(okX, exitAt), ms(okE, errAt)
	t.Logf("aborting %s stderr:\n%s\npeer stderr:\n%s", side, tail(ab.err, 1500), stderrExcerpt(pe.err))
	evidence("lifecycle:", "case=abort-mid-transfer crashed=%v aborter=%s peer_exit_ms=%d peer_error_ms=%d peer_code=%d peer_hung=%v inflight=%s abort_rc=%s peer_error=%s",
		ab.crashed(), side, exitMS, errMS, pe.code, pe.hung, kv.Field(ab.out, ap, "inflight"), kv.Field(ab.out, ap, "rc"),
		kv.Field(pe.out, pp, "error"))
	if ab.crashed() || !okA {
		t.Fatalf("aborting %s did not abort and exit 0 by itself:\n%s", side, ab)
	}
	if pe.signaled() {
		t.Errorf("peer of the aborted %s hung or died of a signal (killed %.0f s after the aborter exited):\n%s", side, pe.at.Sub(ab.at).Seconds(), pe)
	}
	if exitMS < 0 || exitMS > 10000 {
		t.Errorf("peer of the aborted %s exited %d ms after the abort (error after %d ms), want within 10000 ms; -1: no exit line:\n%s", side, exitMS, errMS, pe)
	}
}

var forkRe = regexp.MustCompile(`nettest-fork: role=(\w+) every_ms=\d+ forks=(\d+) exit_children=(\d+) exec_children=(\d+) failed=(\d+) plugin_call_children=(\d+)`)

// TestLifecycleForkAfterConnect: both drivers fork children every 20 ms while a verify
// transfer runs on both rails, in turn one that calls _exit(0) at once, one that execv's
// /bin/true and one that calls the plugin (init, listen, and the closes of the parent's comms:
// each must be refused within 10 s, as MPIB cannot serve a child forked after it loaded).
// Every byte must arrive intact and every child must exit 0.
func TestLifecycleForkAfterConnect(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	force := "MPIB_FORCE_SUP_BW=512"
	args := lcArgs(append(append([]string(nil), verifyArgs...), "--fork-every-ms", "20", "--fork-calls-plugin")...)
	res := runPair(context.Background(), t, a2, a1, pluginEnv(a2, force), pluginEnv(a1, force), args...)
	m := resultRe.FindStringSubmatch(res.serverOut)
	ok := res.serverCode == 0 && res.clientCode == 0 && m != nil && m[4] == "true"
	forks := map[string][]string{}
	for _, out := range []string{res.serverOut, res.clientOut} {
		if f := forkRe.FindStringSubmatch(out); f != nil {
			forks[f[1]] = f
		}
	}
	get := func(role string, i int) string {
		if f := forks[role]; f != nil {
			return f[i]
		}
		return "none"
	}
	refusals := strings.Count(res.serverErr+res.clientErr, "is a fork child of MPIB's process") +
		strings.Count(res.serverErr+res.clientErr, "MPIB cannot run in a forked child")
	evidence("lifecycle:", "case=fork-after-connect verified=%v forks_server=%s forks_client=%s failed_children=%s,%s sup_bytes=%d plugin_call_children=%s,%s refusal_lines=%d",
		ok, get("server", 2), get("client", 2), get("server", 5), get("client", 5), res.tx["a1"][SUP],
		get("server", 6), get("client", 6), refusals)
	if !ok {
		t.Fatalf("verify with fork() every 20 ms did not pass:\n%s", res)
	}
	for _, role := range []string{"server", "client"} {
		if n, _ := strconv.Atoi(get(role, 2)); n == 0 || get(role, 5) != "0" {
			t.Errorf("%s: forks=%s failed=%s: want forks > 0 and every child exiting 0:\n%s", role, get(role, 2), get(role, 5), res)
		}
		if n, _ := strconv.Atoi(get(role, 6)); n == 0 {
			t.Errorf("%s: plugin_call_children=%s: want children that called the plugin and were refused:\n%s", role, get(role, 6), res)
		}
	}
	if refusals == 0 {
		t.Errorf("no child's warning says why the plugin refused it:\n%s", res)
	}
	if res.tx["a1"][SUP] == 0 || res.tx["a1"][SOUT] == 0 {
		t.Errorf("forced split but a1 sent SOUT %d / SUP %d bytes: both rails must carry data", res.tx["a1"][SOUT], res.tx["a1"][SUP])
	}
}

// TestLifecycleStrayClient: before the real client connects, the server opens four TCP
// clients of its own listen address (junk bytes, idle, closed at once, 16 zero bytes);
// accept must still return the real peer's comm with no error, and a verify run follows.
func TestLifecycleStrayClient(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	res := runPair(context.Background(), t, a2, a1, pluginEnv(a2), pluginEnv(a1),
		lcArgs("--mode", "stray-client", "--bytes", "8M", "--max-size", "1M")...)
	const sp = "nettest-lifecycle: case=stray-client role=server"
	acceptOK, strays := kv.Field(res.serverOut, sp, "accept_ok"), kv.Field(res.serverOut, sp, "strays")
	m := resultRe.FindStringSubmatch(res.serverOut)
	verifiedOK := m != nil && m[4] == "true"
	evidence("lifecycle:", "case=stray-client accept_ok=%s strays=%s accept_errors=%s verified=%v server_code=%d client_code=%d",
		acceptOK, strays, kv.Field(res.serverOut, sp, "accept_errors"), verifiedOK, res.serverCode, res.clientCode)
	if strays != "4" {
		t.Fatalf("server opened strays=%q of 4 stray connections: the case tested nothing:\n%s", strays, res)
	}
	if acceptOK != "true" {
		t.Errorf("accept returned an error for a stray connection (NCCL would abort the communicator):\n%s", res)
	}
	if !verifiedOK || res.clientCode != 0 {
		t.Errorf("verify after the stray connections did not pass:\n%s", res)
	}
}

// TestLifecycleDeviceRemoved deletes a1's SUP rxe device while a1 sends to a2 on both rails
// (forced split) and measures how long until both drivers exit with an error (error_ms, the
// later of the two); hang=true when either still ran 30 s after the deletion (then both are
// killed). The device is then recreated as the harness made it and a transfer proves it.
// Failover is off here (MPIB_FAILOVER=0): this is the error path of a connection that cannot
// go on; with failover the transfer continues on SOUT (integration/fault_test.go).
func TestLifecycleDeviceRemoved(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	force, noFailover := "MPIB_FORCE_SUP_BW=512", "MPIB_FAILOVER=0"
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: pluginEnv(a2, force, noFailover),
		clientEnv: pluginEnv(a1, force, noFailover),
		args:      lcArgs("--mode", "verify", "--bytes", "4G", "--max-size", "4M", "--timeout-s", "60")})
	if err := waitRailTraffic(ctx, a1, SUP, 4<<20, srv, cli); err != nil {
		s, c := waitBoth(srv, cli, time.Now(), time.Now())
		t.Fatalf("no SUP traffic from a1 before the deletion: %v\nserver %s\nclient %s", err, s, c)
	}
	tDel := time.Now()
	del, err := deleteRxe(ctx, a1, SUP)
	if err != nil {
		waitBoth(srv, cli, time.Now(), time.Now())
		t.Fatalf("starting rdma link delete %s: %v", a1.Dev(SUP), err)
	}
	t.Cleanup(func() { restoreAfterDelete(t, a1, a2, del) })
	s, c := waitBoth(srv, cli, tDel.Add(30*time.Second), tDel.Add(30*time.Second))
	hang := s.hung || c.hung
	t.Logf("after deleting %s:\nserver stderr:\n%s\nclient stderr:\n%s", a1.Dev(SUP), stderrExcerpt(s.err), stderrExcerpt(c.err))
	errorMS := -1
	if !hang {
		errorMS = int(max(s.at.Sub(tDel), c.at.Sub(tDel)).Milliseconds())
	}
	// The deletion may wait for the drivers' verbs contexts: it can end only after they exit.
	dctx, dcancel := context.WithTimeout(ctx, 90*time.Second)
	defer dcancel()
	dout, _, dcode, derr := del.Wait(dctx)
	evidence("lifecycle:", "case=device-removed error_ms=%d hang=%v device=%s server_code=%d client_code=%d server_exit_ms=%d client_exit_ms=%d delete: %s(exit %d, wait err %v)",
		errorMS, hang, a1.Dev(SUP), s.code, c.code, s.at.Sub(tDel).Milliseconds(), c.at.Sub(tDel).Milliseconds(),
		strings.TrimSpace(dout), dcode, derr)
	if hang {
		t.Errorf("a driver still ran 30 s after %s was deleted (killed then):\nserver %s\nclient %s", a1.Dev(SUP), s, c)
	} else if s.code == 0 || c.code == 0 || s.signaled() || c.signaled() {
		t.Errorf("after %s was deleted both drivers must exit with an error (not 0, not a signal):\nserver %s\nclient %s", a1.Dev(SUP), s, c)
	}
}

// restoreAfterDelete waits for the deletion to finish, recreates the device and proves it with
// a forced-split transfer a1 -> a2. A failure here breaks every later lab test: say so loudly.
func restoreAfterDelete(t *testing.T, a1, a2 *Node, del *Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	broken := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		fmt.Fprintf(os.Stderr, "lifecycle: LAB BROKEN: %s\n", msg)
		t.Errorf("LAB BROKEN: %s: later lab tests will fail", msg)
	}
	if out, errOut, code, err := del.Wait(ctx); err != nil || code != 0 || !strings.Contains(out, "rc=0") {
		broken("rdma link delete %s did not finish cleanly (exit %d, %v): %s %s", a1.Dev(SUP), code, err, out, errOut)
		return
	}
	t0 := time.Now()
	if err := restoreRxe(ctx, a1, SUP); err != nil {
		broken("restoring %s: %v", a1.Dev(SUP), err)
		return
	}
	force := "MPIB_FORCE_SUP_BW=512"
	res := runPair(ctx, t, a2, a1, pluginEnv(a2, force), pluginEnv(a1, force), "--mode", "verify", "--bytes", "8M", "--max-size", "1M")
	m := resultRe.FindStringSubmatch(res.serverOut)
	if res.serverCode != 0 || res.clientCode != 0 || m == nil || m[4] != "true" || res.tx["a1"][SUP] == 0 {
		broken("%s recreated but a forced-split transfer a1 -> a2 failed or sent nothing on SUP (%d bytes):\n%s", a1.Dev(SUP), res.tx["a1"][SUP], res)
		return
	}
	evidence("lifecycle:", "case=device-removed restored=true device=%s gid_index=%d restore_s=%.1f verify_sup_bytes=%d",
		a1.Dev(SUP), a1.GIDIndex(SUP), time.Since(t0).Seconds(), res.tx["a1"][SUP])
}
