package integration

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
	"github.com/mpib/mpib/internal/lab"
)

// TestHostileSegment runs on the host, without the lab: hostile files
// at the segment path must neither stall the plugin nor crash an agent. Its lines:
//
//	hostile: case=segment-lease open_ms=N advanced_fallback=true
//	hostile: case=agent-snapshot-geometry agent=go crashed=false runs=N refused=N ...
//	hostile: case=agent-snapshot-geometry agent=python crashed=false runs=N refused=N ...
func TestHostileSegment(t *testing.T) {
	root, err := lab.FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("segment-lease", func(t *testing.T) { hostileLease(t, root) })
	t.Run("geometry-go", func(t *testing.T) { hostileGeometryGo(t, root) })
	t.Run("geometry-python", func(t *testing.T) { hostileGeometryPython(t, root) })
}

// hostileLease builds and runs plugin/ctest/shm_lease_test.c: the plugin's poll of a segment
// another process holds a write lease on must come back within 100 ms with no segment
// attached, not after the lease break time (45 s) with the handle's lock held.
func hostileLease(t *testing.T, root string) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("the plugin's segment reader is C: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "shm_lease")
	ctest := filepath.Join(root, "plugin", "ctest")
	srcs, err := filepath.Glob(filepath.Join(root, "plugin", "mpib_shm_*.c"))
	if err != nil || len(srcs) == 0 {
		t.Fatalf("the plugin's segment sources (plugin/mpib_shm_*.c): %v", err)
	}
	args := []string{"-std=gnu11", "-O2", "-Wall", "-Werror", "-pthread", "-I" + filepath.Join(root, "plugin"), "-o", bin,
		filepath.Join(ctest, "shm_lease_test.c"), filepath.Join(ctest, "shm_agent.c"), filepath.Join(ctest, "shm_decode.c")}
	build := exec.Command(gcc, append(args, srcs...)...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil {
		t.Fatalf("shm_lease_test: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`segment-lease: open_ms=([0-9.]+) advanced_fallback=(\w+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("shm_lease_test printed no measurement (no lease on this host?):\n%s", out)
	}
	ms, _ := strconv.ParseFloat(string(m[1]), 64)
	evidence("hostile:", "case=segment-lease open_ms=%.3f advanced_fallback=%s", ms, m[2])
	if ms >= 100 || string(m[2]) != "true" {
		t.Fatalf("a leased segment: the poll took %.3f ms (limit 100), fallback %s", ms, m[2])
	}
}

// geometrySegment creates a segment (4 slots, 2 peers) with one
// connection, and flips its header's nslots between 4 and 65536 until the test ends, as a
// process writing garbage into the file would: an agent that validated the header at open
// then reads nslots 65536, and must not slice its 1920-byte mapping to 65536 slots' size
// (25166144 bytes).
func geometrySegment(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "hints")
	s, err := shm.Create(path, 4, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	plug, err := emulate.Attach(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { plug.Close() })
	if _, err := plug.Register(emulate.ConnDesc{PeerSoutIP: 0x0A000207, IsSend: true, NQPsSout: 1, ConnID: 1}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		valid, garbage := binary.LittleEndian.AppendUint32(nil, 4), binary.LittleEndian.AppendUint32(nil, 65536)
		for !stop.Load() {
			f.WriteAt(garbage, 24) // nslots (spec 4.1)
			f.WriteAt(valid, 24)
		}
	}()
	t.Cleanup(func() { stop.Store(true); wg.Wait(); f.Close() })
	return path
}

// cliRuns runs argv n times and counts the outcomes: a run crashed when it exited with a
// status other than 0 or 1, or printed a Go panic or a Python traceback.
type cliRuns struct{ runs, ok, refusedAtOpen, refusedSinceOpen, crashed int }

func (c *cliRuns) run(t *testing.T, env []string, argv ...string) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	c.runs++
	msg := stderr.String()
	var ee *exec.ExitError
	switch {
	case strings.Contains(msg, "panic:") || strings.Contains(msg, "Traceback") ||
		(err != nil && (!errors.As(err, &ee) || ee.ExitCode() != 1)):
		c.crashed++
		t.Errorf("%s crashed (%v):\n%s", filepath.Base(argv[len(argv)-1]), err, msg)
	case err == nil:
		c.ok++
	case strings.Contains(msg, "changed since open"):
		c.refusedSinceOpen++
	case strings.Contains(msg, "bad_geometry"):
		c.refusedAtOpen++
	default:
		t.Errorf("unexpected refusal: %s", msg)
	}
}

func (c cliRuns) line(agent string, extra string) string {
	return fmt.Sprintf("hostile: case=agent-snapshot-geometry agent=%s crashed=%t runs=%d ok=%d refused_at_open=%d refused_since_open=%d%s",
		agent, c.crashed > 0, c.runs, c.ok, c.refusedAtOpen, c.refusedSinceOpen, extra)
}

// hostileGeometryGo: the Go CLI's list (Connections) and its exporter (Snapshot, one open per
// scrape) under a flipping header. Neither may crash; the exporter must stay up.
func hostileGeometryGo(t *testing.T, root string) {
	bin := filepath.Join(root, "build", "mpib-agent")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: build it first (go run mage.go build)", err)
	}
	path := geometrySegment(t)
	var c cliRuns
	for range 100 {
		c.run(t, nil, bin, "list", "--json", "--path", path)
	}
	scrapes, refused, up := exporterScrapes(t, bin, path, 200)
	fmt.Println(c.line("go", fmt.Sprintf(" exporter_scrapes=%d exporter_bad_geometry=%d exporter_up=%t", scrapes, refused, up)))
	if c.crashed > 0 || !up {
		t.Fatalf("the Go agent crashed: %d CLI runs, exporter up %t", c.crashed, up)
	}
	if c.refusedAtOpen+c.refusedSinceOpen+refused == 0 {
		t.Fatal("the flipping header was never seen: the test proves nothing")
	}
}

// exporterScrapes starts `mpib-agent export` on path and scrapes it n times. It returns the
// scrapes answered, how many reported a bad_geometry segment error, and whether the exporter
// was still running at the end.
func exporterScrapes(t *testing.T, bin, path string, n int) (answered, refused int, up bool) {
	cmd := exec.Command(bin, "export", "--listen", "127.0.0.1:0", "--path", path)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() { cmd.Process.Kill(); <-exited }()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`(http://\S+/metrics)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("exporter's first line %q; stderr: %s", line, stderr.String())
	}
	client := http.Client{Timeout: 5 * time.Second}
	for range n {
		resp, err := client.Get(m[1])
		if err != nil {
			break
		}
		body := new(bytes.Buffer)
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		answered++
		if strings.Contains(body.String(), `code="bad_geometry"`) {
			refused++
		}
	}
	select {
	case <-exited:
		t.Errorf("the exporter exited:\n%s", stderr.String())
		return answered, refused, false
	default:
		return answered, refused, true
	}
}

// hostileGeometryPython: the Python CLI's list under a flipping header: exit 0 or 1 with a
// message, never a traceback.
func hostileGeometryPython(t *testing.T, root string) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("the Python agent needs python3: %v", err)
	}
	path := geometrySegment(t)
	env := []string{"PYTHONPATH=" + filepath.Join(root, "agent", "python", "src")}
	var c cliRuns
	for range 40 {
		c.run(t, env, py, "-m", "mpib_agent", "list", "--json", "--path", path)
	}
	fmt.Println(c.line("python", ""))
	if c.crashed > 0 {
		t.Fatalf("the Python agent crashed in %d of %d runs", c.crashed, c.runs)
	}
	if c.refusedAtOpen+c.refusedSinceOpen == 0 {
		t.Fatal("the flipping header was never seen: the test proves nothing")
	}
}
