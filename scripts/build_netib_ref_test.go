package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// build_netib_ref.sh refuses what is not a checkout of nccl-rdma-sharp-plugins, or one too old
// to have the v11 table, with a message that says which, before it compiles anything. (The
// build itself needs that project's sources, which are not part of MPIB: docs/benchmarks.md
// shows it run.)
func TestBuildNetibRefRefuses(t *testing.T) {
	run := func(args ...string) (string, int) {
		out, err := exec.Command("bash", append([]string{"build_netib_ref.sh"}, args...)...).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	dir := t.TempDir()
	so := filepath.Join(dir, "out", "ref.so")
	if out, code := run(); code != 2 || !strings.Contains(out, "usage:") {
		t.Errorf("no arguments: exit %d, %q", code, out)
	}
	if out, code := run(dir, so); code != 1 || !strings.Contains(out, "is not a checkout of nccl-rdma-sharp-plugins") {
		t.Errorf("empty directory: exit %d, %q", code, out)
	}
	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ibvwrap.c", "utils.c", "param.c", "socket.c", "p2p_plugin.c", "ib_plugin.c"} {
		if err := os.WriteFile(filepath.Join(dir, "src", f), []byte("/* v10 only */\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, code := run(dir, so); code != 1 || !strings.Contains(out, "has no v11 table") {
		t.Errorf("a checkout without the v11 table: exit %d, %q", code, out)
	}
	if _, err := os.Stat(filepath.Dir(so)); err == nil {
		t.Errorf("%s was made", filepath.Dir(so))
	}
}
