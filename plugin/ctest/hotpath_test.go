package ctest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpib/mpib/integration/callgrind"
)

// TestHotPathInstructions counts, under callgrind, what each kind of call on the send path
// costs (hotpath/hotpath.c: a send comm on fake verbs, built with the plugin's optimisation
// flag, pluginOptFlag), in vanilla mode and in advanced mode with a fresh agent, and prints
// for each
//
//	hotpath: mode=M isend_no_cts=N isend_posting=N test_pending=N test_completing=N fake_post=N fake_poll=N plugin_per_message=N messages=N harness_per_message=N [over_vanilla=N]
//
// Each figure is the instructions per call of one kind inside the plugin's entry point
// (mpib_isend or mpib_test, as the lab's P4 counts them), the fake provider's included;
// fake_post and fake_poll are that provider's share per message, and plugin_per_message is
// one call of each kind without it: the plugin's own instructions for a message.
// harness_per_message is what the driver's four wrappers spend around those calls (setting
// up the arguments, checking the results), counted in none of the others. The advanced
// line adds over_vanilla: what the agent's hint and telemetry add to plugin_per_message. Unlike the
// lab's P4 (integration's TestBenchP4InstructionsPerMessage), nothing here depends on timing,
// so a change to the path shows as the same figure on every run. It prints figures and checks
// that every message went through; it sets no bound.
func TestHotPathInstructions(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the hot-path count builds a C driver")
	}
	valgrind, err := exec.LookPath("valgrind")
	if err != nil {
		t.Skip("valgrind not found: the hot-path count runs under callgrind")
	}
	p := parseHeader(t, filepath.Join("hotpath", "hotpath.c"))
	dir := t.TempDir()
	bin := filepath.Join(dir, "hotpath")
	args := append([]string{"-std=gnu11", pluginOptFlag(t), "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror", "-pthread", "-I..",
		"-o", bin, p.src}, p.links...)
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	vanilla := countHotPath(t, valgrind, bin, "vanilla", filepath.Join(dir, "callgrind.vanilla"), 0)
	countHotPath(t, valgrind, bin, "advanced", filepath.Join(dir, "callgrind.advanced"), vanilla)
}

// countHotPath runs the driver in one mode under callgrind (valgrind exits with the driver's
// status), prints its hotpath: line (with over_vanilla when vanilla, vanilla mode's
// plugin_per_message, is not 0) and returns its plugin_per_message; the driver says how many
// messages it sent.
func countHotPath(t *testing.T, valgrind, bin, mode, cg string, vanilla float64) float64 {
	out, err := exec.Command(valgrind, "--tool=callgrind", "--callgrind-out-file="+cg, bin, mode).Output()
	var messages int64
	if _, scanErr := fmt.Sscanf(lastLine(string(out)), "messages=%d size=4096 mode="+mode, &messages); err != nil ||
		scanErr != nil || messages <= 0 {
		t.Fatalf("hotpath under callgrind (%s): %v %v\n%s", mode, err, scanErr, out)
	}
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	arcs, err := callgrind.ParseArcs(f)
	if err != nil {
		t.Fatal(err)
	}
	named := func(name, fn string) bool { return name == fn || strings.HasPrefix(name, fn+".") } // gcc's fn.constprop.0
	// perMessage is the instructions per message of the calls into callee (from caller when it
	// is not ""), checked to be wantCalls calls when that is not 0.
	perMessage := func(caller, callee string, wantCalls int64) float64 {
		var c callgrind.CallCost
		for arc, cc := range arcs {
			if named(arc.Callee, callee) && (caller == "" || named(arc.Caller, caller)) {
				c.Calls += cc.Calls
				c.Ir += cc.Ir
			}
		}
		if wantCalls > 0 && c.Calls != wantCalls {
			t.Fatalf("%s -> %s (%s): %d calls, want %d", caller, callee, mode, c.Calls, wantCalls)
		}
		return float64(c.Ir) / float64(messages)
	}
	noCTS, posting := perMessage("isend_no_cts", "mpib_isend", messages), perMessage("isend_posting", "mpib_isend", messages)
	pending, completing := perMessage("test_pending", "mpib_test", messages), perMessage("test_completing", "mpib_test", messages)
	fakePost, fakePoll := perMessage("", "fake_post_send", messages), perMessage("", "fake_poll_cq", 0)
	plugin := noCTS + posting + pending + completing - fakePost - fakePoll
	var wrappers float64
	for _, w := range []string{"isend_no_cts", "isend_posting", "test_pending", "test_completing"} {
		wrappers += perMessage("", w, messages)
	}
	harness := wrappers - (noCTS + posting + pending + completing)
	line := fmt.Sprintf("hotpath: mode=%s isend_no_cts=%.0f isend_posting=%.0f test_pending=%.0f test_completing=%.0f fake_post=%.0f fake_poll=%.0f plugin_per_message=%.0f messages=%d harness_per_message=%.0f",
		mode, noCTS, posting, pending, completing, fakePost, fakePoll, plugin, messages, harness)
	if vanilla != 0 {
		line += fmt.Sprintf(" over_vanilla=%.0f", plugin-vanilla)
	}
	fmt.Println(line)
	return plugin
}

// lastLine is the last non-empty line of out.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}
