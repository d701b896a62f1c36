package integration

import (
	"context"
	"slices"
	"testing"
	"time"
)

// mdStopFile ends TestMultiDeviceAgentRecords' transfer (the receiver stops posting).
const mdStopFile = "/tmp/multidev.stop"

// TestMultiDeviceAgentRecords: in advanced mode a transfer on device 1 registers its
// connections in the agent segment as device 1's, with that pair's NIC names (format 4), and
// both CLIs' --dev keep them apart from device 0's. Fixed line:
//
//	multidev: case=agent-records node=a1 dev=1 sout_nic=a1_sout2 sup_nic=a1_sup2 listed=N other_dev_listed=0 python_listed=N verified=true
func TestMultiDeviceAgentRecords(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	defer freshSegments(ctx, t, mdStopFile, a1, a2)()
	mode := []string{"MPIB_MODE=1", "MPIB_SHM_PATH=" + segPath}
	srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: mdEnv(a2, mode...), clientEnv: mdEnv(a1, mode...),
		args: []string{"--timeout-s", "90", "--dev", "1", "--mode", "verify", "--bytes", "2000M", "--stop-file", mdStopFile,
			"--max-size", "1M", "--window", "8"}})
	defer func() {
		srv.Kill(context.Background())
		cli.Kill(context.Background())
	}()
	// The send and the recv comm register their records one at a time, so a list may catch
	// one of them: the records are taken once a send record is listed and two lists in a row
	// agree, and the other lists (--dev 0, the Python CLI) follow them.
	var conns, prev []deviceConn
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		conns = listDev(ctx, t, goAgent, a1, 1)
		hasSend := slices.ContainsFunc(conns, func(c deviceConn) bool { return c.IsSend != 0 })
		if hasSend && prev != nil && slices.Equal(conns, prev) {
			break
		}
		prev = conns
	}
	other := listDev(ctx, t, goAgent, a1, 0)
	py := listDev(ctx, t, pythonAgent, a1, 1)
	a2.Exec(ctx, nil, "touch", mdStopFile)
	res := waitPair(ctx, t, srv, cli, "the transfer after the stop file")
	verified(t, res)
	wantSout, wantSup := a1.Dev(SOUT2), a1.Dev(SUP2)
	send := 0
	for _, c := range conns {
		if c.Dev != 1 || c.SoutNIC != wantSout || c.SupNIC != wantSup {
			t.Errorf("a1 slot %d listed under --dev 1 as dev %d on %s/%s, want dev 1 on %s/%s", c.Index, c.Dev, c.SoutNIC, c.SupNIC, wantSout, wantSup)
		}
		send += int(c.IsSend)
	}
	evidence("multidev:", "case=agent-records node=a1 dev=1 sout_nic=%s sup_nic=%s listed=%d other_dev_listed=%d python_listed=%d verified=true",
		wantSout, wantSup, len(conns), len(other), len(py))
	if send != 1 || len(other) != 0 || len(py) != len(conns) {
		t.Errorf("a1's segment: %d connection(s) under --dev 1 (%d send, want 1), %d under --dev 0 (want 0), %d from the Python CLI (want the same)",
			len(conns), send, len(other), len(py))
	}
	for _, c := range py {
		if c.Dev != 1 || c.SoutNIC != wantSout || c.SupNIC != wantSup {
			t.Errorf("Python list --dev 1: slot %d as dev %d on %s/%s", c.Index, c.Dev, c.SoutNIC, c.SupNIC)
		}
	}
}
