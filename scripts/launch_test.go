// Package scripts holds the tests of the shell scripts in this directory.
package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func runLaunch(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"launch_nccl.sh"}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func hostfile(t *testing.T, content string) string {
	p := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLaunchDryRun(t *testing.T) {
	hf := hostfile(t, "# cluster\nnode1 slots=8\nnode2 slots=8\n\n")
	out, code := runLaunch(t, []string{"MPIB_SUP_QP=4", "MPIB_AGENT_STALE_MS=250"},
		"--hostfile", hf, "--hca-sout", "mlx5_0", "--hca-sup", "mlx5_1:1", "--oob-if", "eth0", "--mode", "1",
		"--dry-run", "--", "-n", "50")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "all_reduce_perf") || !strings.Contains(lines[1], "sendrecv_perf") {
		t.Fatalf("want one all_reduce_perf and one sendrecv_perf command, got:\n%s", out)
	}
	for _, want := range []string{"-np 16", "--hostfile " + hf, "-x NCCL_NET_PLUGIN=mpib", "-x MPIB_HCA_SOUT ",
		"-x MPIB_HCA_SUP ", "-x MPIB_OOB_IF ", "-x MPIB_MODE ", "-x MPIB_SUP_QP ", "-x MPIB_AGENT_STALE_MS ",
		"MPIB_HCA_SUP=mlx5_1:1", "MPIB_MODE=1", "-b 8 -e 1G -f 2 -g 1 -n 50"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("dry-run command lacks %q:\n%s", want, lines[0])
		}
	}
}

func TestLaunchArgumentErrors(t *testing.T) {
	hf := hostfile(t, "node1\nnode2\n")
	empty := hostfile(t, "# nothing\n")
	base := []string{"--hostfile", hf, "--hca-sout", "a", "--hca-sup", "b", "--oob-if", "eth0", "--dry-run"}
	tests := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no hostfile", nil, []string{"--hca-sout", "a"}, "--hostfile is required"},
		{"unreadable hostfile", nil, []string{"--hostfile", "/nonexistent"}, "not readable"},
		{"empty hostfile", nil, []string{"--hostfile", empty, "--hca-sout", "a", "--hca-sup", "b", "--oob-if", "e"}, "lists no hosts"},
		{"no SOUT", nil, []string{"--hostfile", hf}, "SOUT HCA is required"},
		{"same HCA", nil, []string{"--hostfile", hf, "--hca-sout", "a", "--hca-sup", "a"}, "same HCA"},
		{"no OOB", nil, []string{"--hostfile", hf, "--hca-sout", "a", "--hca-sup", "b"}, "interface is required"},
		{"bad mode", nil, append(base, "--mode", "3"), "--mode must be 0 or 1"},
		{"bad test", nil, append(base, "--test", "bogus"), "--test must be"},
		{"bad np", nil, append(base, "--np", "x"), "--np must be"},
		{"missing value", nil, []string{"--hostfile"}, "--hostfile needs a value"},
		{"unknown flag", nil, append(base, "--frobnicate"), "unknown argument"},
		{"env HCAs", []string{"MPIB_HCA_SOUT=x"}, []string{"--hostfile", hf, "--hca-sup", "x", "--oob-if", "e"}, "same HCA"},
		{"list counts differ", nil, []string{"--hostfile", hf, "--hca-sout", "s0,s1,s2", "--hca-sup", "p0,p1", "--oob-if", "e", "--dry-run"}, "--hca-sout names 3 HCAs and --hca-sup 2"},
		{"a port in both lists", nil, []string{"--hostfile", hf, "--hca-sout", "s0,s1:2", "--hca-sup", "p0,s1:2", "--oob-if", "e"}, "same HCA port (s1:2)"},
		{"a SOUT port in a mesh entry", nil, []string{"--hostfile", hf, "--hca-sout", "mlx5_0", "--hca-sup", "mlx5_1+mlx5_0", "--oob-if", "e", "--dry-run"},
			"SOUT and SUP name the same HCA port (mlx5_0:1)"},
		{"a SOUT port twice", nil, []string{"--hostfile", hf, "--hca-sout", "mlx5_0,mlx5_0:1", "--hca-sup", "p0,p1", "--oob-if", "e", "--dry-run"},
			"--hca-sout names port mlx5_0:1 twice"},
		{"another plugin's name", []string{"NCCL_NET_PLUGIN=aws-ofi"}, base, "NCCL_NET_PLUGIN=aws-ofi names another plugin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, code := runLaunch(t, tt.env, tt.args...)
			if code != 2 || !strings.Contains(out, tt.want) {
				t.Fatalf("exit %d, output %q; want exit 2 mentioning %q", code, out, tt.want)
			}
		})
	}
}

// TestLaunchPassesDeviceLists: an 8-GPU node's lists reach every rank unchanged (one fused
// device per pair; a SUP NIC shared by two GPUs is named twice), and a second port of one
// NIC may serve the other fabric.
func TestLaunchPassesDeviceLists(t *testing.T) {
	hf := hostfile(t, "node1 slots=8\n")
	sout, sup := "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7", "sup0,sup0,sup1,sup1,sup2,sup2,sup3,sup3"
	out, code := runLaunch(t, nil, "--hostfile", hf, "--hca-sout", sout, "--hca-sup", sup, "--oob-if", "e", "--dry-run")
	out = strings.ReplaceAll(out, `\,`, ",") // the dry run prints shell-quoted words (printf %q)
	if code != 0 || !strings.Contains(out, "MPIB_HCA_SOUT="+sout) || !strings.Contains(out, "MPIB_HCA_SUP="+sup) ||
		!strings.Contains(out, "-x MPIB_HCA_SUP") {
		t.Fatalf("exit %d: the lists must reach every rank as given:\n%s", code, out)
	}
	if out, code := runLaunch(t, nil, "--hostfile", hf, "--hca-sout", "m0:1", "--hca-sup", "m0:2", "--oob-if", "e", "--dry-run"); code != 0 {
		t.Fatalf("two ports of one NIC: exit %d\n%s", code, out)
	}
}

func TestLaunchNeedsPluginWhenRunning(t *testing.T) {
	hf := hostfile(t, "node1\n")
	out, code := runLaunch(t, nil, "--hostfile", hf, "--hca-sout", "a", "--hca-sup", "b", "--oob-if", "e",
		"--plugin-dir", t.TempDir())
	if code != 2 || !strings.Contains(out, "no libnccl-net-mpib.so") {
		t.Fatalf("exit %d, %q", code, out)
	}
}

func TestLaunchHelp(t *testing.T) {
	out, code := runLaunch(t, nil, "--help")
	if code != 0 || !strings.Contains(out, "--hostfile FILE") || strings.Contains(out, "set -euo") {
		t.Fatalf("help: exit %d\n%s", code, out)
	}
}

// TestLaunchForwardsNCCLSettings: the NCCL_IB_* settings MPIB reads (a lossless RoCE class,
// the GID index) reach the remote ranks too, and NCCL is pinned to MPIB unless NCCL_NET is set.
func TestLaunchForwardsNCCLSettings(t *testing.T) {
	hf := hostfile(t, "node1\nnode2\n")
	args := []string{"--hostfile", hf, "--hca-sout", "a", "--hca-sup", "b", "--oob-if", "eth0", "--dry-run"}
	out, code := runLaunch(t, []string{"NCCL_IB_TC=106", "NCCL_IB_GID_INDEX=3"}, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{"-x NCCL_IB_TC ", "-x NCCL_IB_GID_INDEX ", "-x NCCL_NET ", "NCCL_NET=MPIB ", "NCCL_IB_TC=106 ",
		"-x NCCL_NET_PLUGIN=mpib ", "-x NCCL_DEBUG=WARN ", "-x NCCL_DEBUG_SUBSYS=INIT\\,NET ", "-x NCCL_SOCKET_IFNAME=eth0 "} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "-x NCCL_DEBUG ") {
		t.Errorf("NCCL_DEBUG forwarded beside the script's own -x NCCL_DEBUG=...:\n%s", out)
	}
	if regexp.MustCompile(`LD_LIBRARY_PATH=\S*:(\s|$)`).MatchString(out) {
		t.Errorf("LD_LIBRARY_PATH unset here: the ranks' must not end in ':' (the current directory):\n%s", out)
	}
	out, _ = runLaunch(t, []string{"NCCL_NET=IB"}, args...)
	if !strings.Contains(out, "NCCL_NET=IB ") || strings.Contains(out, "NCCL_NET=MPIB") {
		t.Errorf("a user's NCCL_NET=IB must win:\n%s", out)
	}
}

// TestLaunchKeepsUserNCCLSettings: the NCCL variables the launcher sets take the
// environment's values where it has them (the help says every NCCL_* is passed on), and
// --debug still wins over NCCL_DEBUG.
func TestLaunchKeepsUserNCCLSettings(t *testing.T) {
	hf := hostfile(t, "node1\nnode2\n")
	args := []string{"--hostfile", hf, "--hca-sout", "a", "--hca-sup", "b", "--oob-if", "eth0", "--dry-run"}
	lib := "/opt/mpib/lib/libnccl-net-mpib.so"
	out, code := runLaunch(t, []string{"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=ALL", "NCCL_NET_PLUGIN=" + lib, "NCCL_SOCKET_IFNAME=^docker"}, args...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{"-x NCCL_DEBUG=INFO ", "-x NCCL_DEBUG_SUBSYS=ALL ", "-x NCCL_NET_PLUGIN=" + lib + " ",
		`-x NCCL_SOCKET_IFNAME=\^docker `} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run lacks %q:\n%s", want, out)
		}
	}
	for _, not := range []string{"NCCL_DEBUG=WARN", "INIT\\,NET", "NCCL_NET_PLUGIN=mpib", "NCCL_SOCKET_IFNAME=eth0"} {
		if strings.Contains(out, not) {
			t.Errorf("dry run overrides the environment with %q:\n%s", not, out)
		}
	}
	out, _ = runLaunch(t, []string{"NCCL_DEBUG=INFO", "NCCL_NET_PLUGIN=mpib"}, append(args, "--debug", "TRACE")...)
	if !strings.Contains(out, "-x NCCL_DEBUG=TRACE ") || !strings.Contains(out, "-x NCCL_NET_PLUGIN=mpib ") {
		t.Errorf("--debug TRACE must win over NCCL_DEBUG=INFO, NCCL_NET_PLUGIN=mpib stay:\n%s", out)
	}
	missing := filepath.Join(t.TempDir(), "libnccl-net-mpib.so")
	out, code = runLaunch(t, []string{"NCCL_NET_PLUGIN=" + missing}, args[:len(args)-1]...)
	if code != 2 || !strings.Contains(out, "NCCL_NET_PLUGIN="+missing+": no such file") {
		t.Errorf("a plugin path that is no file: exit %d, %q", code, out)
	}
}
