package libtest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mpib-nettest --devs (several devices driven at once by one process, one thread each, one
// plugin instance) against the TCP fake plugin with two devices (FAKENET_NDEV=2). Like
// TestNettestDriverSelfCheck this tests the driver, not MPIB: the lab runs the same option
// on two fused MPIB devices (integration/multidev_test.go, TestMultiDeviceOneProcess).

// buildNettestFake compiles mpib-nettest and the fake plugin from the sources into a
// temporary directory (the flags of `mage build` and test_nettest.sh), leaving build/ alone.
func buildNettestFake(t *testing.T) (nettest, fake string) {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("skipping: gcc not found")
	}
	dir := t.TempDir()
	srcs, err := filepath.Glob("../nettest/*.c")
	if err != nil || len(srcs) == 0 {
		t.Fatalf("no nettest sources: %v", err)
	}
	nettest, fake = filepath.Join(dir, "mpib-nettest"), filepath.Join(dir, "libnccl-net-fake.so")
	flags := []string{"-std=gnu11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-I.."}
	args := append(append(append([]string{}, flags...), "-o", nettest), srcs...)
	if out, err := exec.Command("gcc", append(args, "-ldl", "-lpthread", "-lm")...).CombinedOutput(); err != nil {
		t.Fatalf("gcc mpib-nettest: %v\n%s", err, out)
	}
	args = append(append([]string{}, flags...), "-shared", "-fPIC", "-o", fake, "../nettest/fake/fakenet.c")
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc fake plugin: %v\n%s", err, out)
	}
	return nettest, fake
}

// freePorts returns a loopback port p with p+1 free as well (device i's side channel is the
// given port + i). They come from below Linux's ephemeral range (32768-60999 by default):
// ports the kernel handed out there were free when checked and then taken, between the
// check and the driver's listen, as the source port of another test's connection (a CI
// run failed so: "cannot listen on 127.0.0.1:38042: Address already in use").
func freePorts(t *testing.T) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		p := 30000 + rand.IntN(2700)
		l0, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue
		}
		l1, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		l0.Close()
		if err == nil {
			l1.Close()
			return p
		}
	}
	t.Fatal("no two adjacent free loopback ports in 30000..32700")
	return 0
}

type ntSide struct {
	out, err string
	code     int
}

func (s ntSide) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", s.code, s.out, s.err)
}

func runNettest(t *testing.T, bin string, env []string, args ...string) ntSide {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	s := ntSide{out: out.String(), err: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		s.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	return s
}

// runDevsPair runs a server and a client on loopback; serverArgs/clientArgs go to one side
// only, common to both.
func runDevsPair(t *testing.T, nettest, fake string, serverEnv, serverArgs, clientArgs []string, common ...string) (srv, cli ntSide) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(freePorts(t))
	env := []string{"FAKENET_NDEV=2", "NCCL_DEBUG=WARN"}
	done := make(chan ntSide)
	go func() {
		args := append(append([]string{"--role", "server", "--oob-listen", addr, "--plugin", fake}, serverArgs...), common...)
		done <- runNettest(t, nettest, append(append([]string{}, env...), serverEnv...), args...)
	}()
	args := append(append([]string{"--role", "client", "--oob-connect", addr, "--plugin", fake}, clientArgs...), common...)
	cli = runNettest(t, nettest, env, args...)
	srv = <-done
	return srv, cli
}

var (
	devsResultRe = regexp.MustCompile(`(?m)^nettest-result: role=(\w+) mode=(\S+) messages=(\d+) payload_bytes=(\d+) verified=(\w+) .* dev=(\d+)$`)
	devsLineRe   = regexp.MustCompile(`^nettest-devs: role=(\w+) devs=(\S+) exit=(\S+) worst=(\d+)$`)
	devFieldRe   = regexp.MustCompile(` dev=(\d+)$`)
)

// checkDevLines: every line a device's run printed ends with its dev=N (N one of 0, 1), the
// process-wide lines (init, props, devs, profiler) carry none appended; returns the
// nettest-devs line's fields.
func checkDevLines(t *testing.T, side string, s ntSide) []string {
	t.Helper()
	var devs []string
	for _, l := range strings.Split(strings.TrimSpace(s.out), "\n") {
		switch {
		case strings.HasPrefix(l, "nettest-init:"), strings.HasPrefix(l, "nettest-profiler:"):
			if strings.Contains(l, " dev=") {
				t.Errorf("%s: process-wide line with a dev field: %s", side, l)
			}
		case strings.HasPrefix(l, "nettest-props: dev="):
			if strings.Count(l, " dev=") != 1 {
				t.Errorf("%s: props line with a second dev field: %s", side, l)
			}
		case strings.HasPrefix(l, "nettest-devs:"):
			if devs = devsLineRe.FindStringSubmatch(l); devs == nil {
				t.Errorf("%s: malformed %s", side, l)
			}
		default:
			m := devFieldRe.FindStringSubmatch(l)
			if m == nil || (m[1] != "0" && m[1] != "1") {
				t.Errorf("%s: a device run's line without dev=0|1 at its end: %q", side, l)
			}
		}
	}
	if devs == nil {
		t.Errorf("%s: no nettest-devs line:\n%s", side, s)
	}
	return devs
}

// devsResults maps dev -> its nettest-result fields [role mode messages payload_bytes verified].
func devsResults(t *testing.T, side string, s ntSide) map[string][]string {
	t.Helper()
	res := map[string][]string{}
	for _, m := range devsResultRe.FindAllStringSubmatch(s.out, -1) {
		if _, dup := res[m[6]]; dup {
			t.Errorf("%s: two result lines for dev %s", side, m[6])
		}
		res[m[6]] = m[1:6]
	}
	return res
}

func TestNettestDevsFake(t *testing.T) {
	nettest, fake := buildNettestFake(t)

	t.Run("verify", func(t *testing.T) {
		stats := filepath.Join(t.TempDir(), "server.stats")
		srv, cli := runDevsPair(t, nettest, fake, nil, []string{"--stats-file", stats}, nil,
			"--devs", "0,1", "--mode", "verify", "--count", "300", "--max-size", "256K", "--multi", "2", "--timeout-s", "30")
		if srv.code != 0 || cli.code != 0 {
			t.Fatalf("want both sides to exit 0\nserver %s\nclient %s", srv, cli)
		}
		sr, cr := devsResults(t, "server", srv), devsResults(t, "client", cli)
		for _, d := range []string{"0", "1"} {
			s, c := sr[d], cr[d]
			if s == nil || c == nil {
				t.Fatalf("dev %s: result lines server %v client %v\nserver %s\nclient %s", d, s, c, srv, cli)
			}
			if s[0] != "server" || c[0] != "client" || s[1] != "verify" || s[4] != "true" || c[4] != "true" ||
				s[2] != "300" || s[2] != c[2] || s[3] != c[3] {
				t.Errorf("dev %s: server %v client %v: want 300 messages verified, the same bytes on both sides", d, s, c)
			}
		}
		if sr["0"][3] == sr["1"][3] {
			t.Errorf("devices 0 and 1 moved the same %s bytes: each position must use its own seed", sr["0"][3])
		}
		for _, side := range []struct {
			name string
			s    ntSide
		}{{"server", srv}, {"client", cli}} {
			devs := checkDevLines(t, side.name, side.s)
			if devs != nil && (devs[1] != side.name || devs[2] != "0,1" || devs[3] != "0,0" || devs[4] != "0") {
				t.Errorf("%s: %s, want devs=0,1 exit=0,0 worst=0", side.name, devs[0])
			}
			for _, d := range []string{"0", "1"} {
				if !strings.Contains(side.s.err, "mpib-nettest: [dev="+d+"] connected in ") {
					t.Errorf("%s: no '[dev=%s] connected' line on stderr:\n%s", side.name, d, side.s.err)
				}
			}
		}
		if b, err := os.ReadFile(stats); err != nil || string(b) != srv.out {
			t.Errorf("--stats-file must hold the same lines as stdout (%v):\n%s\nstdout:\n%s", err, b, srv.out)
		}
	})

	t.Run("bw", func(t *testing.T) {
		srv, cli := runDevsPair(t, nettest, fake, nil, nil, nil,
			"--devs", "1,0", "--mode", "bw", "--sizes", "4096,256K", "--iters", "10", "--warmup", "2", "--timeout-s", "30")
		if srv.code != 0 || cli.code != 0 {
			t.Fatalf("want both sides to exit 0\nserver %s\nclient %s", srv, cli)
		}
		for _, side := range []struct {
			name string
			s    ntSide
		}{{"server", srv}, {"client", cli}} {
			if devs := checkDevLines(t, side.name, side.s); devs != nil && (devs[2] != "1,0" || devs[3] != "0,0") {
				t.Errorf("%s: %s, want devs=1,0 exit=0,0", side.name, devs[0])
			}
			r := devsResults(t, side.name, side.s)
			for _, d := range []string{"0", "1"} {
				if r[d] == nil || r[d][1] != "bw" || r[d][4] != "true" {
					t.Errorf("%s: dev %s: result %v, want bw verified=true", side.name, d, r[d])
				}
				re := regexp.MustCompile(`(?m)^nettest-bw: size=262144 iters=10 .*role=` + side.name + ` .*verified=true dev=` + d + `$`)
				if !re.MatchString(side.s.out) {
					t.Errorf("%s: no verified nettest-bw line of size 256K for dev %s:\n%s", side.name, d, side.s.out)
				}
			}
		}
	})

	// One device fails, the other passes: each run's exit code in nettest-devs, the process
	// exits with the worst. The fake corrupts the N-th message every receive comm gets: N is
	// the smaller device's message count, so only the device with more messages is hit.
	t.Run("worst", func(t *testing.T) {
		common := []string{"--devs", "0,1", "--mode", "verify", "--bytes", "6M", "--max-size", "1M", "--timeout-s", "30"}
		srv, cli := runDevsPair(t, nettest, fake, nil, nil, nil, common...)
		r := devsResults(t, "server", srv)
		if srv.code != 0 || cli.code != 0 || r["0"] == nil || r["1"] == nil {
			t.Fatalf("clean run failed\nserver %s\nclient %s", srv, cli)
		}
		m0, _ := strconv.Atoi(r["0"][2])
		m1, _ := strconv.Atoi(r["1"][2])
		if m0 == m1 {
			t.Skipf("both devices sent %d messages: no message index hits one device only", m0)
		}
		bad := "1"
		if m0 > m1 {
			bad = "0"
		}
		srv, cli = runDevsPair(t, nettest, fake, []string{"FAKENET_CORRUPT_MSG=" + strconv.Itoa(min(m0, m1))}, nil, nil, common...)
		if srv.code != 1 || cli.code != 1 {
			t.Fatalf("want both sides to exit 1 (the worst run)\nserver %s\nclient %s", srv, cli)
		}
		want := map[string]string{"0": "0", "1": "0"}
		want[bad] = "1"
		for _, side := range []struct {
			name string
			s    ntSide
		}{{"server", srv}, {"client", cli}} {
			devs := checkDevLines(t, side.name, side.s)
			if exit := want["0"] + "," + want["1"]; devs != nil && (devs[3] != exit || devs[4] != "1") {
				t.Errorf("%s: %s, want exit=%s worst=1", side.name, devs[0], exit)
			}
			res := devsResults(t, side.name, side.s)
			for d, code := range want {
				if v := map[string]string{"0": "true", "1": "false"}[code]; res[d] == nil || res[d][4] != v {
					t.Errorf("%s: dev %s: result %v, want verified=%s", side.name, d, res[d], v)
				}
			}
		}
		if !strings.Contains(srv.err, "mpib-nettest: [dev="+bad+"] msg=") {
			t.Errorf("server: the mismatch report must name dev %s:\n%s", bad, srv.err)
		}
	})

	// Without --devs nothing is appended: the single-device lines stay as they were.
	t.Run("single", func(t *testing.T) {
		srv, cli := runDevsPair(t, nettest, fake, nil, nil, nil, "--dev", "1", "--count", "20", "--max-size", "64K", "--timeout-s", "30")
		if srv.code != 0 || cli.code != 0 {
			t.Fatalf("want both sides to exit 0\nserver %s\nclient %s", srv, cli)
		}
		re := regexp.MustCompile(`(?m)^nettest-result: role=server mode=verify messages=20 payload_bytes=\d+ verified=true seconds=[\d.]+ mbps=[\d.]+ mismatches=0 window=8 multi=1 flushes=0$`)
		if !re.MatchString(srv.out) || strings.Contains(srv.out, "nettest-devs:") || strings.Contains(srv.err, "[dev=") {
			t.Errorf("single-device output changed:\n%s", srv)
		}
		if !strings.Contains(srv.out, "\nnettest-props: dev=1 name=fake1 ") {
			t.Errorf("want dev 1's properties first:\n%s", srv.out)
		}
	})

	t.Run("sides-disagree", func(t *testing.T) {
		srv, cli := runDevsPair(t, nettest, fake, nil, []string{"--devs", "0,1"}, []string{"--devs", "1,0"}, "--count", "10", "--timeout-s", "10")
		if srv.code != 2 || cli.code != 2 || !strings.Contains(srv.err, "disagree on parameters") {
			t.Errorf("different --devs lists: want exit 2 on both sides and 'disagree'\nserver %s\nclient %s", srv, cli)
		}
	})

	t.Run("usage", func(t *testing.T) {
		base := []string{"--role", "client", "--oob-connect", "127.0.0.1:1", "--plugin", fake, "--timeout-s", "1"}
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--devs", "0,1", "--dev", "1"}, "--dev and --devs are mutually exclusive"},
			{[]string{"--dev", "0", "--devs", "0,1"}, "--dev and --devs are mutually exclusive"},
			{[]string{"--devs", ""}, "bad --devs '' (want a comma-separated list"},
			{[]string{"--devs", "0,,1"}, "bad --devs '0,,1'"},
			{[]string{"--devs", "0,"}, "bad --devs '0,'"},
			{[]string{"--devs", "0,x"}, "bad --devs '0,x'"},
			{[]string{"--devs", "1,0,1"}, "bad --devs '1,0,1' (device 1 is listed twice)"},
			{[]string{"--devs", "0,2"}, "--devs lists device 2 but the plugin has 2 device(s)"},
			{[]string{"--devs", "0,1", "--mode", "abort-mid-transfer"}, "--mode abort-mid-transfer drives the whole plugin"},
			{[]string{"--devs", "0,1", "--mode", "connect"}, "--mode connect drives the whole plugin"},
			{[]string{"--devs", "0,1", "--fork-every-ms", "10"}, "--fork-every-ms forks for the whole process"},
		} {
			s := runNettest(t, nettest, []string{"FAKENET_NDEV=2"}, append(append([]string{}, base...), c.args...)...)
			if s.code != 2 || !strings.Contains(s.err, "mpib-nettest: "+c.want) {
				t.Errorf("%v: want exit 2 and %q\n%s", c.args, c.want, s)
			}
		}
		s := runNettest(t, nettest, nil, "--role", "client", "--oob-connect", "127.0.0.1:65535", "--devs", "0,1")
		if s.code != 2 || !strings.Contains(s.err, "leaves no room for 2 ports") {
			t.Errorf("port 65535 with two devices: want exit 2\n%s", s)
		}
		h := runNettest(t, nettest, nil, "--help")
		if h.code != 0 || !strings.Contains(h.out, "--devs LIST") || !strings.Contains(h.out, "port + i") {
			t.Errorf("--help must document --devs and its ports\n%s", h)
		}
	})
}
