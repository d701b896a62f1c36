package doctor

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Traffic through the plugin itself, per rail, by mpib-nettest (docs/nettest.md): a C
// driver that loads the plugin the way NCCL's proxy does. The doctor runs it as a subprocess
// because a Go process cannot load the plugin (it carries a Go runtime of its own).

// PluginLib is the plugin's file name.
const PluginLib = "libnccl-net-mpib.so"

// FindNettest looks for mpib-nettest beside the running program (a release's bin/, the
// build's build/), then on PATH; and for the plugin beside it or in ../lib (a release's
// layout), else leaves it to the loader's search path.
func FindNettest(explicit, plugin string) Nettest {
	exe, _ := os.Executable()
	dir := filepath.Dir(exe)
	n := Nettest{Plugin: plugin}
	switch {
	case explicit != "":
		if isExecutable(explicit) {
			n.Path = explicit
		} else {
			n.Why = "--nettest " + explicit + " is not an executable file"
		}
	case exe != "" && isExecutable(filepath.Join(dir, "mpib-nettest")):
		n.Path = filepath.Join(dir, "mpib-nettest")
	default:
		if p, err := exec.LookPath("mpib-nettest"); err == nil {
			n.Path = p
		} else {
			n.Why = "no mpib-nettest beside " + exe + " or on PATH"
		}
	}
	if n.Plugin == "" {
		for _, cand := range []string{filepath.Join(dir, PluginLib), filepath.Join(dir, "..", "lib", PluginLib)} {
			if _, err := os.Stat(cand); err == nil {
				n.Plugin = filepath.Clean(cand)
				break
			}
		}
	}
	return n
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// NettestRun is one side's traffic test on one rail.
type NettestRun struct {
	Role    string // server (receives) or client (sends)
	Connect string // the side channel: the server's listen address, the client's target
	Device  int
	Rail    string // SOUT or SUP: MPIB_FORCE_SUP_BW 0 or 1024 puts every byte on it
	Seconds int
	Timeout int // --timeout-s: connection setup, and a data loop without progress
}

// Args is the driver's command line after its path: a bandwidth run of 1 MiB messages for
// Seconds, payloads sample-verified (so the rail's RDMA writes are checked, not only timed).
func (r NettestRun) Args(plugin string) []string {
	var a []string
	if plugin != "" {
		a = append(a, "--plugin", plugin)
	}
	side := "--oob-listen"
	if r.Role == "client" {
		side = "--oob-connect"
	}
	return append(a, "--role", r.Role, side, r.Connect, "--dev", strconv.Itoa(r.Device), "--mode", "bw",
		"--sizes", "1M", "--warmup", "2", "--seconds", strconv.Itoa(r.Seconds), "--verify", "on",
		"--timeout-s", strconv.Itoa(r.Timeout))
}

// Env is the job's environment with the rail forced: SOUT gets no SUP share, SUP all of it.
func (r NettestRun) Env(base []string) []string {
	share := "0"
	if r.Rail == "SUP" {
		share = "1024"
	}
	env := append([]string{}, base...)
	if !hasKey(base, "NCCL_DEBUG") {
		env = append(env, "NCCL_DEBUG=WARN")
	}
	return append(env, "MPIB_FORCE_SUP_BW="+share) // the last of a duplicated key wins (os/exec)
}

func hasKey(env []string, key string) bool {
	for _, e := range env {
		if strings.HasPrefix(e, key+"=") {
			return true
		}
	}
	return false
}

// Result is a traffic test's outcome on one side, or both sides merged.
type Result struct {
	Exit     int     `json:"exit"`
	Verified bool    `json:"verified"`
	Mbps     float64 `json:"mbps"` // the receiver's figure; -1 none
	Why      string  `json:"why,omitempty"`
	Skipped  bool    `json:"skipped,omitempty"`
}

// Runner runs one side of a traffic test; RunNettest is the real one.
type Runner func(ctx context.Context, n Nettest, run NettestRun, env []string) Result

// RunNettest runs mpib-nettest and reads its result lines.
func RunNettest(ctx context.Context, n Nettest, run NettestRun, env []string) Result {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(2*run.Timeout+run.Seconds+30)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.Path, run.Args(n.Plugin)...)
	cmd.Env = run.Env(env)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	res := ParseNettest(run.Role, out.String(), errOut.String())
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.Exit = ee.ExitCode()
	case err != nil:
		res.Exit, res.Why = -1, err.Error()
	}
	if res.Exit != 0 && res.Why == "" {
		res.Why = "mpib-nettest exit " + strconv.Itoa(res.Exit)
	}
	return res
}

// ParseNettest reads a driver's output: verified and the receiver's Mbit/s from the
// nettest-result line (the client's nettest-bw rx_mbps when the server's figure is not its
// own), and, when it failed, the last error line of stderr as the reason.
func ParseNettest(role, stdout, stderr string) Result {
	res := Result{Mbps: -1}
	for _, line := range strings.Split(stdout, "\n") {
		kv := fields(line)
		switch {
		case strings.HasPrefix(line, "nettest-result:"):
			res.Verified = kv["verified"] == "true"
			if role == "server" {
				res.Mbps = parseFloat(kv["mbps"], res.Mbps)
			}
		case strings.HasPrefix(line, "nettest-bw:") && role == "client":
			res.Mbps = parseFloat(kv["rx_mbps"], res.Mbps)
		}
	}
	if !res.Verified {
		res.Why = lastError(stderr)
	}
	return res
}

func fields(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

func parseFloat(s string, def float64) float64 {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return def
	}
	return f
}

// lastError is why a run failed: the driver's last message, with the plugin's last warning
// beside it (the driver says what failed, the plugin why: "SOUT HCA 'mlx5_0' not found").
func lastError(stderr string) string {
	var driver, plugin string
	for _, l := range strings.Split(stderr, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "mpib-nettest:") && !strings.HasPrefix(l, "mpib-nettest: loaded "):
			driver = l
		case strings.HasPrefix(l, "NCCL WARN"):
			plugin = l
		}
	}
	switch {
	case driver != "" && plugin != "":
		return driver + " (" + plugin + ")"
	case driver != "":
		return driver
	case plugin != "":
		return plugin
	}
	return "no verified result"
}

// Merge combines both sides' results: reachable only when both ended well and the receiver
// verified; the receiver's figure when it has one.
func Merge(server, client Result) Result {
	m := Result{Exit: server.Exit, Verified: server.Verified && client.Verified && server.Exit == 0 && client.Exit == 0,
		Mbps: server.Mbps, Skipped: server.Skipped || client.Skipped}
	if m.Mbps < 0 {
		m.Mbps = client.Mbps
	}
	switch {
	case m.Skipped:
		m.Why = server.Why
		if m.Why == "" {
			m.Why = client.Why
		}
	case server.Exit != 0 || !server.Verified:
		m.Why = "server: " + server.Why
	case client.Exit != 0 || !client.Verified:
		m.Exit, m.Why = client.Exit, "client: "+client.Why
	}
	return m
}

// Apply writes a merged result into the rail's line.
func (pr *PairRail) Apply(r Result) {
	switch {
	case r.Skipped:
		pr.Reachable, pr.Why = "unknown", r.Why
	case r.Verified:
		pr.Reachable, pr.Why, pr.Mbps = "true", "", r.Mbps
	default:
		pr.Reachable, pr.Why, pr.Mbps = "false", r.Why, r.Mbps
	}
}
