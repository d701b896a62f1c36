package ctest

// The failover model checker (model/checker.c): the data path and failover C of both ends of a
// connection on a fake fabric, over every schedule of up to two faults (and random ones of up
// to three); see the checker's header for what it models and checks. CI runs it for a budget
// of seconds; `mage bench` runs at least a million schedules (MPIB_MODEL_SCHEDULES,
// MPIB_MODEL_SHARDS). The mutants show it has teeth: each re-introduces a defect it must find.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// modelSources are the product files the checker links (everything else it fakes); a pattern
// names every file it matches.
var modelSources = []string{"mpib_p2p.c", "mpib_failover.c", "mpib_watch.c", "mpib_slots.c", "mpib_flush.c", "mpib_shm_*.c", "mpib_profiler.c"}

// buildChecker compiles model/checker.c against the plugin sources in dir (the plugin itself,
// or a mutated copy) with extra flags, into a binary in a temporary directory.
func buildChecker(t *testing.T, dir string, flags ...string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: the model checker needs gcc")
	}
	checker, err := filepath.Abs(filepath.Join("model", "checker.c"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "checker")
	args := append([]string{"-std=gnu11", "-g", "-Wall", "-Wextra", "-Werror", "-pthread", "-I", dir}, flags...)
	args = append(args, "-o", bin, checker)
	for _, s := range modelSources {
		files, err := filepath.Glob(filepath.Join(dir, s))
		if err != nil || len(files) == 0 {
			t.Fatalf("model source %s: no file in %s (%v)", s, dir, err)
		}
		args = append(args, files...)
	}
	if out, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// modelLine parses the checker's "model: k=v ..." line.
func modelLine(t *testing.T, out []byte) map[string]string {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "model: "); ok {
			m := map[string]string{}
			for _, f := range strings.Fields(line) {
				if k, v, ok := strings.Cut(f, "="); ok {
					m[k] = v
				}
			}
			return m
		}
	}
	t.Fatalf("no model: line in the checker's output:\n%s", out)
	return nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestFailoverModel explores schedules for MPIB_MODEL_SECONDS (CI: 30) or until
// MPIB_MODEL_SCHEDULES ran, in MPIB_MODEL_SHARDS processes, and requires every invariant to
// hold in every one of them.
func TestFailoverModel(t *testing.T) {
	plugin, _ := filepath.Abs("..")
	bin := buildChecker(t, plugin, pluginOptFlag(t))
	seconds := envInt("MPIB_MODEL_SECONDS", 30)
	shards := envInt("MPIB_MODEL_SHARDS", 1)
	minSchedules := envInt("MPIB_MODEL_SCHEDULES", 0)
	outs := make([][]byte, shards)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	for k := 0; k < shards; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			per := (minSchedules + shards - 1) / shards
			outs[k], errs[k] = exec.Command(bin, "explore", strconv.Itoa(seconds), strconv.Itoa(per),
				strconv.Itoa(k), strconv.Itoa(shards)).CombinedOutput()
		}(k)
	}
	wg.Wait()
	sum := map[string]int64{}
	var last map[string]string
	for k := range outs {
		if errs[k] != nil {
			t.Errorf("shard %d: %v\n%s", k, errs[k], outs[k])
			continue
		}
		last = modelLine(t, outs[k])
		for key, v := range last {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				sum[key] += n
			}
		}
	}
	if last == nil {
		return
	}
	for _, key := range []string{"wrong_bytes", "undelivered_sends", "hangs", "leaks", "unordered_flushes", "unexpected_errors", "not_dead", "spurious_failovers", "standby_early"} {
		if sum[key] != 0 {
			t.Errorf("%s=%d, want 0", key, sum[key])
		}
	}
	if sum["standby_schedules"] == 0 {
		t.Error("standby_schedules=0: no schedule had a standby rail join")
	}
	if sum["schedules"] < int64(minSchedules) {
		t.Errorf("schedules=%d, want at least %d", sum["schedules"], minSchedules)
	}
	maxFaults := last["max_faults"]
	fmt.Printf("model: schedules=%d max_faults=%s fault_kinds=%s lanes=%s wrong_bytes=%d undelivered_sends=%d hangs=%d errors=%d leaks=%d seconds=%d unordered_flushes=%d unexpected_errors=%d not_dead=%d shards=%d spurious_failovers=%d standby_schedules=%d standby_early=%d\n",
		sum["schedules"], maxFaults, last["fault_kinds"], last["lanes"], sum["wrong_bytes"], sum["undelivered_sends"], sum["hangs"],
		sum["errors"], sum["leaks"], sum["seconds"]/int64(shards), sum["unordered_flushes"], sum["unexpected_errors"], sum["not_dead"], shards, sum["spurious_failovers"],
		sum["standby_schedules"], sum["standby_early"])
}

// TestFailoverModelSanitized runs the checker briefly under AddressSanitizer and
// UndefinedBehaviorSanitizer: the data path's memory use under faults, not only its outcomes.
func TestFailoverModelSanitized(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found")
	}
	san := sanitizers(t, gcc)
	if san == nil {
		t.Skip("this toolchain cannot link AddressSanitizer: the sanitized run needs it")
	}
	plugin, _ := filepath.Abs("..")
	bin := buildChecker(t, plugin, append([]string{"-O1"}, san...)...)
	out, err := exec.Command(bin, "explore", "6").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	m := modelLine(t, out)
	t.Logf("sanitized: schedules=%s", m["schedules"])
}

// A mutant: one product file with one text replaced (it must occur exactly once, so a mutant
// that no longer applies fails instead of passing unchanged).
type mutant struct {
	name, file, old, new string
}

var mutants = []mutant{
	// Defect 1: no confirm of acknowledged ranges a fence record lacks (a receiver's NIC dies
	// with a completion it has not polled: the receive never completes).
	{"receiver-nic-dies-unpolled", "mpib_failover.c", "    if (!ranges) continue;\n    st->seq1[slot] = seq1;", "    if (1) continue;\n    st->seq1[slot] = seq1;"},
	// Defect 2: the flush QP reset grants the data QPs' access (its reads then fail), and a
	// failed read counts as done.
	{"flush-reset-wrong-access", "mpib_flush.c", "mpib_qp_reset_to_init(c, qp, lane, MPIB_FLUSH_QP_ACCESS)", "mpib_qp_reset_to_init(c, qp, lane, MPIB_DATA_QP_ACCESS)"},
	{"flush-failed-read-done", "mpib_flush.c", "    if (wc.status == IBV_WC_SUCCESS) continue;\n", "    continue;\n"},
	// Defect 3: a RECOVER on a dead device is ignored (the sender retries forever).
	{"recover-dead-device-unanswered", "mpib_failover.c", `if (mpib_rail_fatal(c, r)) return recv_refuse(c, r, gen, 1, "its device died");`, "if (mpib_rail_fatal(c, r)) return ncclSuccess;"},
	// H2: a full send queue fails the connection instead of waiting.
	{"full-send-queue-fails", "mpib_failover.c", "  if (rc == ENOMEM) {\n    c->ctrl_rdma_due |= due;",
		"  if (rc == ENOMEM) {\n    return comm_failed(c, \"posting a failover message failed: \", strerror(rc));\n    c->ctrl_rdma_due |= due;"},
	{"send-queue-unaccounted", "mpib_slots.c", "  c->sq_used[qi] = (uint16_t)(c->sq_used[qi] + nwr);", "  (void)nwr;"},
	// H3: a short write on the control socket is ignored (its framing breaks).
	{"control-short-write", "mpib_failover.c", "  memcpy(c->ctrl_out + c->ctrl_out_n, msg, len);\n  c->ctrl_out_n += (uint32_t)len;\n  (void)ctrl_flush_locked(c);",
		"  (void)send(c->ctrl_fd, msg, len, MSG_DONTWAIT | MSG_NOSIGNAL);"},
	// A slot posted on a rail out of service (flushed after its fence was settled).
	{"post-on-fenced-rail", "mpib_p2p.c", "  return c->rail[rail].state == MPIB_RAIL_UP || !mpib_g.failover;", "  return 1;"},
	// A quiet sender leaves a fence record that arrived for a later tick even when the call
	// polled a completion: a write of the fenced rail a dying device acknowledged after the
	// control plane answered is never confirmed when the call that polled it was NCCL's last.
	{"quiet-sender-leaves-record", "mpib_failover.h", "    if (rdma->fence_gen == gen || tcp->fence_gen == gen) return 0;\n", ""},
	// No confirm for a receive posted after the fence record: its write on the fenced rail, which
	// a dying device acknowledged before the sender read the record, completes the send and is
	// never replayed, while the receiver drops the fenced rail's completion.
	{"confirm-misses-posted-after-record", "mpib_policy.h", "  if (slot_seq >= next_seq) return acked;\n", "  (void)next_seq;\n"},
	// A standby rail's recovery starts before it joined (the sender has no QPs of it yet).
	{"standby-tried-before-join", "mpib_failover.c", "      if (!mpib_join_take(c, r)) return ncclSuccess;\n", ""},
	// A flush reads on every lane of a rail that placed bytes, not only on the lanes that did:
	// a striped lane's device that dies having placed none of them fails the flush.
	{"flush-reads-unused-lane", "mpib_p2p.c", "  req->wrote_lanes |= 1u << lane;\n", "  req->wrote_lanes |= rail == MPIB_RAIL_SUP ? 6u : 1u;\n"},
	// The control plane does not answer a fence record (a sender NCCL is not calling).
	{"idle-sender-no-answer", "mpib_failover.c", "  if (!c->is_send || rail < 0 || rail >= MPIB_NRAILS || c->ctrl_fd < 0) return;\n  memcpy(&rec", "  if (1) return;\n  memcpy(&rec"},
}

var firstFailure = regexp.MustCompile(`model-first-failure: schedule=(\S+) steps=(\d+) schedules=(\d+)`)

// TestFailoverModelMutants builds each mutant and requires the checker to find a failing
// schedule; it prints the shortest it found first (singles are explored before pairs) as a
// seed `checker replay ID` replays.
func TestFailoverModelMutants(t *testing.T) {
	plugin, _ := filepath.Abs("..")
	srcs, _ := filepath.Glob(filepath.Join(plugin, "*.[ch]"))
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, src := range srcs {
				b, err := os.ReadFile(src)
				if err != nil {
					t.Fatal(err)
				}
				if filepath.Base(src) == m.file {
					if n := bytes.Count(b, []byte(m.old)); n != 1 {
						t.Fatalf("mutant %s: %q occurs %d times in %s, want once", m.name, m.old, n, m.file)
					}
					b = bytes.Replace(b, []byte(m.old), []byte(m.new), 1)
				}
				if err := os.WriteFile(filepath.Join(dir, filepath.Base(src)), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			bin := buildChecker(t, dir, "-O2", "-Wno-unused-function", "-Wno-unused-variable", "-Wno-unused-parameter")
			out, err := exec.Command(bin, "first-failure", "90").CombinedOutput()
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			f := firstFailure.FindSubmatch(out)
			if f == nil {
				t.Fatalf("model-mutant: name=%s found=false\n%s", m.name, out)
			}
			fmt.Printf("model-mutant: name=%s found=true steps=%s schedule=%s schedules_tried=%s\n", m.name, f[2], f[1], f[3])
		})
	}
}
