// Command mpib-agent creates and drives the MPIB hint segment (docs/shm-format.md):
// list connections, set hints, watch per-rail throughput, run a policy loop with heartbeat.
//
// mpib-agent-py (agent/python) takes the same commands and flags and prints the same output;
// TestCLIsAgree runs both on one segment. Exit status: 0 done, 1 the operation failed (stderr:
// "mpib-agent CMD: CODE: message", CODE shared with the Python agent), 2 the command line is
// wrong.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
)

const prog = "mpib-agent"

const usage = `usage: mpib-agent COMMAND [flags]

commands:
  create     create the segment (mode 0600)          [--slots N --peers N --force]
  list       list connections and their hints        [--json]
  set        set or clear a hint                     (--conn SLOT|PID:CONN [--gen G] | --peer IP[/LEN] | --class intra|inter) (--sup-bw N | --clear)
  top        live per-rail throughput                [--interval D --count N --plain --json]
  record     write samples to a file                 --out FILE [--format jsonl|csv --interval D --count N]
  heartbeat  beat until stopped (hints apply only while an agent beats)
  run        policy loop with heartbeat              --policy static --file W.json | --policy proportional [--capacity sout=X,sup=Y]
                                                     | --policy closed-loop [--step N] [--interval D]
  gc         reclaim slots of dead processes
  export     Prometheus metrics of the segment       [--listen 127.0.0.1:9877|unix:PATH] [--allow-remote] [--max-peers N] (docs/metrics.md)
  doctor     preflight check of this node, or of two [--json] [--listen ADDR:PORT | --peer HOST:PORT] (docs/deploying.md)

--version prints the release's version and commit (the plugin's init INFO line names its own);
every command takes --path (default $MPIB_SHM_PATH or /dev/shm/mpib-hints-EUID);
durations are seconds (0.5) or a number with a unit (500ms, 2s, 1m); run --interval: 1 s, closed-loop 0.5 s;
closed-loop --step: largest move of the split per interval in parts per 1024, integer 1..256 (default 64);
top --json and record: {"t": unix s, "conns": [{slot, gen, pid, conn_id, is_send, path_class,
  sout_mbps, sup_mbps, last_sup_bw, sout_state, sup_state, sout_completed_mbps, sup_completed_mbps,
  sout_latency_us, sup_latency_us, sout_inflight_bytes, sup_inflight_bytes, applied_sup_bw,
  flush_wall_ns, dev, sout_nic, sup_nic}]} per interval (csv: one row per connection);
agents beat every MPIB_AGENT_STALE_MS/4 (default 500 ms)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmds := map[string]func([]string, io.Writer) error{
		"create": cmdCreate, "list": cmdList, "set": cmdSet, "top": cmdTop,
		"heartbeat": cmdHeartbeat, "daemon": cmdHeartbeat, "run": cmdRun, "gc": cmdGC, "record": cmdRecord,
		"export": cmdExport,
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(usage)
		return
	}
	if name == "--version" || name == "version" {
		fmt.Println(versionLine())
		return
	}
	if name == "doctor" { // its own exit statuses: 0 healthy, 1 problems, 2 invalid configuration
		os.Exit(cmdDoctor(os.Args[2:], os.Stdout, os.Stderr))
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "%s: unknown command %q\n\n%s", prog, name, usage)
		os.Exit(2)
	}
	os.Exit(report(name, cmd(os.Args[2:], os.Stdout)))
}

// report prints err as "mpib-agent CMD: CODE: message" and returns the exit status.
func report(cmd string, err error) int {
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 2 // the flag package printed the usage
	}
	code := errCode(err)
	fmt.Fprintf(os.Stderr, "%s %s: %s: %v\n", prog, cmd, code, err)
	if code == "usage" {
		return 2
	}
	return 1
}

// usageError is a wrong command line (exit 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func errCode(err error) string {
	var ue usageError
	switch {
	case errors.As(err, &ue) || errors.Is(err, flag.ErrHelp):
		return "usage"
	case errors.Is(err, policy.ErrBadWeights):
		return "bad_weights"
	}
	return shm.Code(err)
}

func warn(err error) {
	fmt.Fprintf(os.Stderr, "%s: warning: %v\n", prog, err)
}

// reportClamp prints a clamp as a warning and passes other errors on.
func reportClamp(err error) error {
	if errors.Is(err, shm.ErrHintClamped) {
		warn(err)
		return nil
	}
	return err
}

func newFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(prog+" "+name, flag.ContinueOnError)
	path := fs.String("path", shm.DefaultPath(), "segment file")
	return fs, path
}

// parse parses a subcommand's flags; a flag error or a stray argument is a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// parseAndOpen parses a subcommand's flags, then opens the segment that --path names.
func parseAndOpen(fs *flag.FlagSet, args []string, path *string) (*shm.Segment, error) {
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	return shm.Open(*path)
}

var durRe = regexp.MustCompile(`^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)?$`)

// parseDuration reads "0.5" (seconds) or a number with a unit (500ms, 2s, 1m); > 0.
func parseDuration(flagName, s string) (time.Duration, error) {
	m := durRe.FindStringSubmatch(s)
	if m == nil {
		return 0, usagef("--%s %q: want seconds (0.5) or a number with a unit (500ms, 2s, 1m)", flagName, s)
	}
	f, _ := strconv.ParseFloat(m[1], 64)
	unit := map[string]float64{"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, "": 1e9, "m": 60e9, "h": 3600e9}[m[2]]
	ns := math.Round(f * unit)
	if ns < 1 || ns > math.MaxInt64/2 {
		return 0, usagef("--%s %q: must be above 0", flagName, s)
	}
	return time.Duration(ns), nil
}

// fmtDur prints a duration the way both CLIs do: milliseconds, up to 3 decimals.
func fmtDur(d time.Duration) string {
	return strconv.FormatFloat(math.Round(float64(d)/1e3)/1e3, 'f', -1, 64) + " ms"
}

var intRe = regexp.MustCompile(`^[+-]?[0-9]+$`)

// parseInt reads a decimal integer flag (range checks are the caller's).
func parseInt(flagName, s string) (int64, error) {
	if !intRe.MatchString(s) {
		return 0, usagef("--%s %q: want an integer", flagName, s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if s[0] == '-' {
			return math.MinInt64, nil
		}
		return math.MaxInt64, nil
	}
	return v, nil
}

func cmdCreate(args []string, out io.Writer) error {
	fs, path := newFlags("create")
	slotsS := fs.String("slots", strconv.Itoa(shm.DefaultSlots), "connection slots (1..65536)")
	peersS := fs.String("peers", strconv.Itoa(shm.DefaultPeers), "per-peer default entries (0..4096)")
	force := fs.Bool("force", false, "replace a segment even while in use (plugins move to the new one)")
	if err := parse(fs, args); err != nil {
		return err
	}
	slots, err := parseInt("slots", *slotsS)
	if err != nil {
		return err
	}
	peers, err := parseInt("peers", *peersS)
	if err != nil {
		return err
	}
	if slots < 1 || slots > shm.MaxSlots || peers < 0 || peers > shm.MaxPeers {
		return fmt.Errorf("create %s: %w: --slots %d (1..%d) --peers %d (0..%d)", *path, shm.ErrBadGeometry,
			slots, shm.MaxSlots, peers, shm.MaxPeers)
	}
	s, err := shm.Create(*path, uint32(slots), uint32(peers), *force)
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(out, "created %s: %d slots, %d peers, %d bytes, mode 0600\n", *path, slots, peers,
		shm.TotalSize(uint32(slots), uint32(peers)))
	return nil
}

func cmdGC(args []string, out io.Writer) error {
	fs, path := newFlags("gc")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	freed, err := s.GC()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "reclaimed %d slot(s)%s\n", len(freed), slotList(freed))
	return nil
}

func slotList(s []uint32) string {
	out := ""
	for i, v := range s {
		if i == 0 {
			out = ":"
		}
		out += " " + strconv.FormatUint(uint64(v), 10)
	}
	return out
}
