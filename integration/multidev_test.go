package integration

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mpib/mpib/integration/kv"
)

// Two fused devices per node: a1 and a2 have a second pair of rxe devices on
// networks of their own (SOUT2, SUP2: docs/lab.md), and the plugin is given both pairs
// (MPIB_HCA_SOUT=a1_sout,a1_sout2, MPIB_HCA_SUP=a1_sup,a1_sup2). One driver process per device,
// as NCCL runs one rank per GPU, each on its own device (--dev); and one driver process for
// both devices (--devs 0,1: one thread per device, one plugin instance), as one NCCL process
// with two GPUs. Fixed lines:
//
//	devices: node=a1 fused=2 dev=0 sout=a1_sout sup=a1_sup rail_id=0 plane_id=-1 pci=(null)
//	abi: version=12 verified=true rail_id=0,1
//	multidev: pair=a1-a2 dev=0 sout_bytes=N sup_bytes=N other_dev_bytes=N verified=true concurrent_verified=true
//	multidev: case=concurrent pair=a1-a2 devs=2 link_mbit=12.5 ratio=X
//	multidev: case=failover dev=1 rail=SUP other_dev_ratio=X verified=true
//	multidev: case=one-process pair=a1-a2 devs=2 verified=true dev0_bytes=N dev1_bytes=N
//
// sout_bytes/sup_bytes are what the device's own two netdevs sent while it transferred alone
// (split 512: both rails busy), other_dev_bytes what the other device's two sent meanwhile
// (nothing else uses them: the plugin's control path is SOUT's); the two devices then
// transfer at the same time, each verified.

const (
	mdPayload  = "12M"
	mdLinkKbit = 12500 // per rail; see TestMultiDeviceConcurrent
)

var mdRails = [2][2]Rail{{SOUT, SUP}, {SOUT2, SUP2}}

// mdTx reads what each of the node's four rails has sent.
func mdTx(ctx context.Context, t *testing.T, n *Node) map[Rail]uint64 {
	t.Helper()
	tx := map[Rail]uint64{}
	for _, d := range mdRails {
		for _, r := range d {
			c, err := n.Counters(ctx, r)
			if err != nil {
				t.Fatal(err)
			}
			tx[r] = c.TxBytes
		}
	}
	return tx
}

// mdRun runs one a1 -> a2 verified transfer per listed device, all at once, and returns each
// pair's result with the bytes a1's rails sent meanwhile.
func mdRun(ctx context.Context, t *testing.T, devs []int, env []string, args ...string) ([]pairResult, map[Rail]uint64) {
	t.Helper()
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	before := mdTx(ctx, t, a1)
	type procs struct{ srv, cli *Process }
	var ps []procs
	for _, d := range devs {
		srv, cli := startPair(ctx, t, nettestPair{server: a2, client: a1, serverEnv: mdEnv(a2, env...), clientEnv: mdEnv(a1, env...),
			args: append([]string{"--timeout-s", "90", "--dev", strconv.Itoa(d), "--mode", "verify", "--bytes", mdPayload,
				"--max-size", "1M", "--window", "8"}, args...)})
		ps = append(ps, procs{srv, cli})
	}
	res := make([]pairResult, len(ps))
	for i, p := range ps {
		var cerr, serr error
		res[i].clientOut, res[i].clientErr, res[i].clientCode, cerr = p.cli.Wait(ctx)
		res[i].serverOut, res[i].serverErr, res[i].serverCode, serr = p.srv.Wait(ctx)
		if cerr != nil || serr != nil {
			for _, q := range ps {
				q.srv.Kill(context.Background())
				q.cli.Kill(context.Background())
			}
			t.Fatalf("device %d's transfer did not finish: client %v, server %v", devs[i], cerr, serr)
		}
	}
	after := mdTx(ctx, t, a1)
	sent := map[Rail]uint64{}
	for r, v := range after {
		sent[r] = v - before[r]
	}
	return res, sent
}

var propsDevRe = regexp.MustCompile(`(?m)^nettest-props: dev=(\d+) name=mpib\[([^+\]]+)\+([^\]]+)\] pciPath=(\S+) .*?(?: railId=(-?\d+) planeId=(-?\d+))?$`)

// mdDevices prints a node's devices: lines from its driver's nettest-props lines and returns
// their rail ids by device.
func mdDevices(t *testing.T, node, out string) map[int]string {
	t.Helper()
	rails := map[int]string{}
	ms := propsDevRe.FindAllStringSubmatch(out, -1)
	for _, m := range ms {
		d, _ := strconv.Atoi(m[1])
		rails[d] = m[5]
		evidence("devices:", "node=%s fused=%d dev=%d sout=%s sup=%s rail_id=%s plane_id=%s pci=%s", node, len(ms), d, m[2], m[3], m[5], m[6], m[4])
	}
	if len(ms) != 2 {
		t.Errorf("%s: want two fused devices in the driver's properties, got %d:\n%s", node, len(ms), out)
	}
	return rails
}

// TestMultiDevice: each device alone (its own rails carry it, the other device's carry
// nothing), then both at once, every transfer verified; the devices' properties, and ABI
// v12's rail ids, from the drivers.
func TestMultiDevice(t *testing.T) {
	lab := labOrSkip(t)
	a1 := lab.Node("a1")
	ctx := context.Background()
	split := []string{"MPIB_MODE=1", "MPIB_FORCE_SUP_BW=512"} // no agent: both rails carry half
	type solo struct {
		own         [2]uint64
		other       uint64
		verifiedAll bool
	}
	var solos [2]solo
	for d := range 2 {
		res, sent := mdRun(ctx, t, []int{d}, split, "--abi", "12")
		payload := verified(t, res[0])
		o := mdRails[1-d]
		solos[d] = solo{own: [2]uint64{sent[mdRails[d][0]], sent[mdRails[d][1]]}, other: sent[o[0]] + sent[o[1]], verifiedAll: true}
		if d == 0 {
			rails := mdDevices(t, "a1", res[0].clientOut)
			mdDevices(t, "a2", res[0].serverOut)
			evidence("abi:", "version=12 verified=true rail_id=%s,%s", rails[0], rails[1])
			if rails[0] != "0" || rails[1] != "1" {
				t.Errorf("v12 railId by position: got %s,%s, want 0,1", rails[0], rails[1])
			}
		}
		if solos[d].own[0] < payload/4 || solos[d].own[1] < payload/4 {
			t.Errorf("device %d alone (split 512): its rails sent %d + %d bytes of %d", d, solos[d].own[0], solos[d].own[1], payload)
		}
		if solos[d].other*100 >= payload {
			t.Errorf("device %d alone: the other device's rails sent %d bytes (payload %d): want < 1 %%", d, solos[d].other, payload)
		}
	}
	res, _ := mdRun(ctx, t, []int{0, 1}, split)
	for d := range 2 {
		verified(t, res[d])
		evidence("multidev:", "pair=a1-a2 dev=%d sout_bytes=%d sup_bytes=%d other_dev_bytes=%d verified=true concurrent_verified=true",
			d, solos[d].own[0], solos[d].own[1], solos[d].other)
	}
	if t.Failed() {
		t.Logf("a1's netdevs: %v", []string{a1.Netdev(SOUT), a1.Netdev(SUP), a1.Netdev(SOUT2), a1.Netdev(SUP2)})
	}
}

// mbps reads the receiver's rate from its nettest-result line.
func mdMbps(t *testing.T, res pairResult) float64 {
	t.Helper()
	verified(t, res)
	v, err := strconv.ParseFloat(kv.Field(res.serverOut, "nettest-result:", "mbps"), 64)
	if err != nil || v <= 0 {
		t.Fatalf("no rate in the receiver's result:\n%s", res.serverOut)
	}
	return v
}

// mdShape shapes (kbit > 0) or unshapes a1's four rails.
func mdShape(ctx context.Context, t *testing.T, kbit int) {
	t.Helper()
	lab := labOrSkip(t)
	a1 := lab.Node("a1")
	for _, d := range mdRails {
		for _, r := range d {
			q := ""
			if kbit > 0 {
				q = fmt.Sprintf("netem rate %dkbit limit 10000", kbit)
			}
			if err := lab.Shape(ctx, a1, r, q); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestMultiDeviceConcurrent: with every rail of a1 shaped, two devices at once carry about
// twice what one carries. Vanilla (intra-island: all on SUP) at 12.5 Mbit/s per rail: one
// device's transfer is then bound by its SUP link, and two devices need 25 Mbit/s of the lab
// VM, well inside the 45-50 Mbit/s a busy host's VM was measured to carry on two rails at once
// (closedloop: carried_kbit); at 25 Mbit/s two devices would need 50 and measure the VM.
func TestMultiDeviceConcurrent(t *testing.T) {
	labOrSkip(t)
	ctx := context.Background()
	mdShape(ctx, t, mdLinkKbit)
	defer mdShape(ctx, t, 0)
	// The split-detect watch (labSplitDetect, 3 s), not the plugin's 600 ms: a 1 MiB message
	// (--max-size 1M) takes ~670 ms to cross a 12.5 Mbit/s rail, so the 600 ms watch can fail a
	// healthy SUP over in either run, and the ratio would then measure that failover, not two
	// devices' rates.
	env := []string{"MPIB_MODE=0", labSplitDetect}
	one, _ := mdRun(ctx, t, []int{0}, env)
	alone := mdMbps(t, one[0])
	both, _ := mdRun(ctx, t, []int{0, 1}, env)
	together := mdMbps(t, both[0]) + mdMbps(t, both[1])
	ratio := together / alone
	evidence("multidev:", "case=concurrent pair=a1-a2 devs=2 link_mbit=%.1f ratio=%.3f", float64(mdLinkKbit)/1000, ratio)
	t.Logf("one device %.2f Mbit/s; both: %.2f + %.2f", alone, mdMbps(t, both[0]), mdMbps(t, both[1]))
	if ratio < 1.8 {
		t.Errorf("two devices at once carried %.2f times what one carries, want >= 1.8", ratio)
	}
}

// TestMultiDeviceFailover: device 1's SUP link goes down while both devices transfer on
// shaped rails (vanilla: all on SUP); device 1 fails over to its SOUT and device 0 keeps its
// rate: its SUP's rate from the cut until 2 s after device 1's failover, over its rate in the
// 4 s before the cut, must be >= 0.9. Both transfers stay verified.
func TestMultiDeviceFailover(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mdShape(ctx, t, mdLinkKbit)
	defer mdShape(context.Background(), t, 0)
	t.Cleanup(func() { restoreLab(t, a1, a2) })
	env := []string{"MPIB_MODE=0", "MPIB_FAILOVER=1"}
	var fps [2]*faultPair
	for d := range 2 {
		fps[d] = startFaultPair(ctx, t, a2, a1, mdEnv(a2, env...), mdEnv(a1, env...),
			"--dev", strconv.Itoa(d), "--mode", "verify", "--bytes", "1000G", "--timeout-s", "30", "--max-size", "256K")
		defer fps[d].killUnlessStopped()
	}
	for d, r := range []Rail{SUP, SUP2} {
		if err := waitRailTraffic(ctx, a1, r, 1<<20, fps[d].srv, fps[d].cli); err != nil {
			t.Fatalf("device %d: no traffic on %s before the fault: %v", d, r, err)
		}
	}
	rate := func(from, to float64, b0, b1 uint64) float64 {
		return float64(b1-b0) * 8 / (to - from) / 1e6
	}
	// supTx reads a1's SUP tx_bytes and the node's clock (/proc/uptime, s) in one cat, so the
	// rates are taken on the clock the counter moves by: the host's clock after an exec
	// returns would add the exec's latency (0.1 s idle, seconds under load) to one end of a
	// 4 s window and not the other.
	supTx := func() (uint64, float64) {
		out, err := a1.output(ctx, "cat", "/proc/uptime", "/sys/class/net/"+a1.Netdev(SUP)+"/statistics/tx_bytes")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(out) // uptime, idle time, tx_bytes
		if len(f) != 3 {
			t.Fatalf("a1: uptime and SUP tx_bytes: %q", out)
		}
		at, err1 := strconv.ParseFloat(f[0], 64)
		tx, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("a1: uptime and SUP tx_bytes: %q", out)
		}
		return tx, at
	}
	b0, t0 := supTx()
	time.Sleep(4 * time.Second)
	b1, t1 := supTx()
	before := rate(t0, t1, b0, b1)
	if _, _, code, err := a1.Exec(ctx, nil, "ip", "link", "set", "dev", a1.Netdev(SUP2), "down"); err != nil || code != 0 {
		t.Fatalf("link down: exit %d %v", code, err)
	}
	log := fps[1].base + "-client.err"
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, _, _ := a1.Exec(ctx, nil, "grep", "-c", "failover: rail=SUP side=send", log)
		if n, _ := strconv.Atoi(strings.TrimSpace(out)); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("device 1 did not fail over within 20 s of its SUP link going down")
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(2 * time.Second)
	b2, t2 := supTx()
	during := rate(t1, t2, b1, b2)
	a1.Exec(ctx, nil, "ip", "link", "set", "dev", a1.Netdev(SUP2), "up")
	ratio := during / before
	var ok [2]bool
	for d := range 2 {
		s, c := fps[d].stop(ctx, time.Now().Add(60*time.Second))
		m := resultRe.FindStringSubmatch(s.out)
		ok[d] = s.code == 0 && c.code == 0 && m != nil && m[4] == "true"
		if !ok[d] {
			t.Errorf("device %d's transfer must stay verified:\nserver %s\nclient %s", d, s, c)
		}
	}
	evidence("multidev:", "case=failover dev=1 rail=SUP other_dev_ratio=%.3f verified=%v", ratio, ok[0] && ok[1])
	t.Logf("device 0's SUP: %.2f Mbit/s in the 4 s before the cut, %.2f from the cut to 2 s after device 1's failover", before, during)
	if ratio < 0.9 {
		t.Errorf("device 0's rate during device 1's failover fell to %.3f of its rate before, want >= 0.9", ratio)
	}
}

// mdDevResultRe is one device's result line in a --devs process: the single-device fields,
// then dev=N appended at the end (docs/nettest.md, "Several devices in one process").
var mdDevResultRe = regexp.MustCompile(`(?m)^nettest-result: role=(\w+) mode=verify messages=(\d+) payload_bytes=(\d+) verified=(\w+) .* dev=(\d+)$`)

// mdDevResults maps each device to its result line's [role messages payload_bytes verified].
func mdDevResults(out string) map[int][]string {
	res := map[int][]string{}
	for _, m := range mdDevResultRe.FindAllStringSubmatch(out, -1) {
		d, _ := strconv.Atoi(m[5])
		res[d] = m[1:5]
	}
	return res
}

// TestMultiDeviceOneProcess: one driver process per node drives both fused devices at once
// (--devs 0,1: one thread per device, one plugin instance, one init and one finalize, as one
// NCCL process with two GPUs). Each device's a1 -> a2 transfer is verified, and each is
// carried by its own rails: devN_bytes is what device N's two netdevs on a1 sent meanwhile
// (split 512: both rails busy), at least that device's payload.
func TestMultiDeviceOneProcess(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := []string{"MPIB_MODE=1", "MPIB_FORCE_SUP_BW=512"}
	port := int(oobPort.Add(2)) - 1 // device i's side channel is port + i
	addr := a2.IP(SOUT) + ":" + strconv.Itoa(port)
	args := []string{"--plugin", pluginLib, "--timeout-s", "90", "--devs", "0,1", "--mode", "verify", "--bytes", mdPayload,
		"--max-size", "1M", "--window", "8"}
	before := mdTx(ctx, t, a1)
	srv, err := a2.Start(ctx, mdEnv(a2, env...), append([]string{nettestBin, "--role", "server", "--oob-listen", addr}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := a1.Start(ctx, mdEnv(a1, env...), append([]string{nettestBin, "--role", "client", "--oob-connect", addr}, args...)...)
	if err != nil {
		srv.Kill(context.Background())
		t.Fatal(err)
	}
	res := waitPair(ctx, t, srv, cli, "the --devs 0,1 transfer")
	after := mdTx(ctx, t, a1)
	rx, tx := mdDevResults(res.serverOut), mdDevResults(res.clientOut)
	ok := res.serverCode == 0 && res.clientCode == 0
	var devBytes, payload [2]uint64
	for d := range 2 {
		for _, r := range mdRails[d] {
			devBytes[d] += after[r] - before[r]
		}
		s, c := rx[d], tx[d]
		if s == nil || c == nil || s[0] != "server" || c[0] != "client" || s[3] != "true" || c[3] != "true" || s[2] != c[2] {
			t.Errorf("device %d: receiver's result %v, sender's %v: want both verified=true with the same bytes", d, s, c)
			ok = false
			continue
		}
		payload[d], _ = strconv.ParseUint(s[2], 10, 64)
	}
	for _, out := range []string{res.serverOut, res.clientOut} {
		if l := hasLine(out, "nettest-devs:"); !strings.Contains(l, " devs=0,1 exit=0,0 worst=0") {
			t.Errorf("want both devices' runs to have ended with exit 0: %q", l)
			ok = false
		}
	}
	evidence("multidev:", "case=one-process pair=a1-a2 devs=2 verified=%v dev0_bytes=%d dev1_bytes=%d", ok, devBytes[0], devBytes[1])
	if !ok {
		t.Fatalf("one process, two devices:\n%s", res)
	}
	for d := range 2 {
		if devBytes[d] < payload[d] {
			t.Errorf("device %d's rails sent %d bytes, less than its payload %d: its transfer went elsewhere", d, devBytes[d], payload[d])
		}
	}
}

// TestMultiDeviceOnePortMissing: a1 and a2 are given their two device pairs with device 0's
// SUP NIC named as one that does not exist. The plugin leaves out device 0 alone, saying so,
// and keeps device 1 (now NCCL's device 0) with its own rail id, 1, which carries a verified
// transfer between the nodes' second pairs.
//
//	multidev: case=one-port-missing devices=1 rail_id=1 verified=true left_out_line=true
func TestMultiDeviceOnePortMissing(t *testing.T) {
	lab := labOrSkip(t)
	a1, a2 := lab.Node("a1"), lab.Node("a2")
	ctx := context.Background()
	env := func(n *Node) []string {
		return nodeEnv(n, hcas{n.Dev(SOUT) + "," + n.Dev(SOUT2), "mpib_absent9," + n.Dev(SUP2)})
	}
	res := runPair(ctx, t, a2, a1, env(a2), env(a1), "--timeout-s", "90", "--dev", "0", "--mode", "verify",
		"--bytes", "4M", "--max-size", "1M", "--window", "8", "--abi", "12")
	m := resultRe.FindStringSubmatch(res.serverOut)
	verifiedOK := res.serverCode == 0 && res.clientCode == 0 && m != nil && m[4] == "true"
	props := propsDevRe.FindAllStringSubmatch(res.clientOut, -1)
	rail, sout := "none", "none"
	if len(props) == 1 {
		rail, sout = props[0][5], props[0][2]
	}
	leftOut := strings.Contains(res.clientErr, "device 0 (SOUT "+a1.Dev(SOUT)) && strings.Contains(res.clientErr, "NCCL gets 1 of 2 devices")
	evidence("multidev:", "case=one-port-missing devices=%d rail_id=%s verified=%v left_out_line=%v", len(props), rail, verifiedOK, leftOut)
	if len(props) != 1 || rail != "1" || sout != a1.Dev(SOUT2) {
		t.Errorf("a1's devices: %d (rail %s, SOUT %s), want exactly device 1's pair (SOUT %s, rail 1):\n%s", len(props), rail, sout, a1.Dev(SOUT2), res)
	}
	if !leftOut {
		t.Errorf("no warning says device 0 was left out:\n%s", res)
	}
	if !verifiedOK {
		t.Fatalf("the surviving device's transfer did not verify:\n%s", res)
	}
}
