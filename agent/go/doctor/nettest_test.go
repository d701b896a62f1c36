package doctor

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseNettest(t *testing.T) {
	srvOut := "nettest-init: rc=0 ndev=1\n" +
		"nettest-bw: size=1048576 iters=120 seconds=2.000000 mbps=503.316 role=server verified=true\n" +
		"nettest-result: role=server mode=bw messages=120 payload_bytes=125829120 verified=true seconds=2.000000 mbps=503.316 sizes=1 window=8 multi=1 sampled_verify=on\n"
	cliOut := "nettest-bw: size=1048576 iters=120 seconds=1.990000 mbps=505.000 role=client rx_mbps=503.316 verified=true\n" +
		"nettest-result: role=client mode=bw messages=120 payload_bytes=125829120 verified=true seconds=1.99 mbps=505.000\n"
	for _, c := range []struct {
		name, role, out, errOut string
		want                    Result
	}{
		{"server", "server", srvOut, "", Result{Verified: true, Mbps: 503.316}},
		{"client takes the receiver's figure", "client", cliOut, "", Result{Verified: true, Mbps: 503.316}},
		{"mismatch", "server", strings.ReplaceAll(srvOut, "verified=true", "verified=false"),
			"NCCL INFO x\nmpib-nettest: msg=3 tag=0 size=1048576: first mismatch at offset 7\n",
			Result{Mbps: 503.316, Why: "mpib-nettest: msg=3 tag=0 size=1048576: first mismatch at offset 7"}},
		{"no device", "client", "nettest-init: rc=0 ndev=0\n",
			"mpib-nettest: loaded x.so: ncclNetPlugin_v11 name=MPIB\nNCCL WARN NET/MPIB : SOUT HCA 'mlx5_0' not found (0 RDMA devices visible)\nmpib-nettest: plugin init succeeded but reports no device\n",
			Result{Mbps: -1, Why: "mpib-nettest: plugin init succeeded but reports no device (NCCL WARN NET/MPIB : SOUT HCA 'mlx5_0' not found (0 RDMA devices visible))"}},
		{"plugin warning alone", "client", "", "NCCL WARN NET/MPIB : SUP HCA 'nosuch' not found\n",
			Result{Mbps: -1, Why: "NCCL WARN NET/MPIB : SUP HCA 'nosuch' not found"}},
		{"nothing", "client", "", "", Result{Mbps: -1, Why: "no verified result"}},
	} {
		if got := ParseNettest(c.role, c.out, c.errOut); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestMerge(t *testing.T) {
	ok := Result{Verified: true, Mbps: 500}
	for _, c := range []struct {
		name        string
		server, cli Result
		want        Result
	}{
		{"both verified", ok, Result{Verified: true, Mbps: 499}, Result{Verified: true, Mbps: 500}},
		{"server failed", Result{Exit: 1, Mbps: -1, Why: "stall"}, ok, Result{Exit: 1, Mbps: 500, Why: "server: stall"}},
		{"client failed", ok, Result{Exit: 3, Mbps: -1, Why: "no device"}, Result{Exit: 3, Mbps: 500, Why: "client: no device"}},
		{"receiver figure from the client", Result{Verified: true, Mbps: -1}, ok, Result{Verified: true, Mbps: 500}},
		{"skipped", Result{Skipped: true, Mbps: -1, Why: "off"}, Result{Skipped: true, Mbps: -1, Why: "off"}, Result{Skipped: true, Mbps: -1, Why: "off"}},
	} {
		if got := Merge(c.server, c.cli); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestNettestRunArgsEnv(t *testing.T) {
	r := NettestRun{Role: "client", Connect: "10.0.1.11:18601", Device: 1, Rail: "SUP", Seconds: 3, Timeout: 30}
	want := "--plugin /opt/mpib/libnccl-net-mpib.so --role client --oob-connect 10.0.1.11:18601 --dev 1 --mode bw --sizes 1M --warmup 2 --seconds 3 --verify on --timeout-s 30"
	if got := strings.Join(r.Args("/opt/mpib/libnccl-net-mpib.so"), " "); got != want {
		t.Errorf("args %q\nwant %q", got, want)
	}
	if got := strings.Join(NettestRun{Role: "server", Connect: "0.0.0.0:1"}.Args("")[:2], " "); got != "--role server" {
		t.Errorf("server args without a plugin start %q", got)
	}
	env := r.Env([]string{"MPIB_FORCE_SUP_BW=512", "MPIB_HCA_SUP=rxe1"})
	if env[len(env)-1] != "MPIB_FORCE_SUP_BW=1024" || !slices.Contains(env, "NCCL_DEBUG=WARN") {
		t.Errorf("SUP env %v: the forced share must come last, with NCCL_DEBUG=WARN", env)
	}
	r.Rail = "SOUT"
	if env := r.Env([]string{"NCCL_DEBUG=INFO"}); env[len(env)-1] != "MPIB_FORCE_SUP_BW=0" || slices.Contains(env, "NCCL_DEBUG=WARN") {
		t.Errorf("SOUT env %v", env)
	}
}

// RunNettest against a stand-in driver: a script that prints what mpib-nettest prints for
// its role and rail, and fails when the rail was not forced.
func TestRunNettest(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "mpib-nettest")
	body := `#!/bin/sh
case "$MPIB_FORCE_SUP_BW" in 0|1024) ;; *) echo "mpib-nettest: rail not forced" >&2; exit 2;; esac
[ "$2" = server ] || { echo "mpib-nettest: side channel: connection refused" >&2; exit 2; }
echo "nettest-result: role=server mode=bw verified=true seconds=1.000000 mbps=$MPIB_FORCE_SUP_BW.5"
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	n := Nettest{Path: script}
	got := RunNettest(context.Background(), n, NettestRun{Role: "server", Connect: "0.0.0.0:1", Rail: "SUP", Seconds: 1, Timeout: 1}, nil)
	if got != (Result{Verified: true, Mbps: 1024.5}) {
		t.Errorf("server: %+v", got)
	}
	got = RunNettest(context.Background(), n, NettestRun{Role: "client", Connect: "h:1", Rail: "SOUT", Seconds: 1, Timeout: 1}, nil)
	if got.Exit != 2 || got.Why != "mpib-nettest: side channel: connection refused" {
		t.Errorf("client: %+v", got)
	}
	got = RunNettest(context.Background(), Nettest{Path: filepath.Join(dir, "absent")}, NettestRun{Role: "client", Timeout: 1}, nil)
	if got.Exit != -1 || got.Why == "" {
		t.Errorf("absent driver: %+v", got)
	}
}

func TestFindNettest(t *testing.T) {
	dir := t.TempDir()
	notExec := filepath.Join(dir, "mpib-nettest")
	os.WriteFile(notExec, []byte("x"), 0o644)
	if n := FindNettest(notExec, ""); n.Path != "" || !strings.Contains(n.Why, "is not an executable file") {
		t.Errorf("a non-executable --nettest: %+v", n)
	}
	os.Chmod(notExec, 0o755)
	if n := FindNettest(notExec, "/p/lib.so"); n.Path != notExec || n.Plugin != "/p/lib.so" {
		t.Errorf("an executable --nettest: %+v", n)
	}
}
