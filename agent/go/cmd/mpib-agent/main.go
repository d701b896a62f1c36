// Command mpib-agent creates and drives the MPIB hint segment (docs/shm-format.md):
// list connections, set hints, watch per-rail throughput, run a policy loop with heartbeat.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/mpib/mpib/agent/go/shm"
)

const usage = `usage: mpib-agent COMMAND [flags]

commands:
  create     create the segment (mode 0600)          [--slots N --peers N --force]
  list       list connections and their hints        [--json]
  set        set or clear a hint                     (--conn SLOT|PID:CONN | --peer IP[/LEN] | --class intra|inter) (--sup-bw N | --clear)
  top        live per-rail throughput                [--interval D --count N --plain]
  heartbeat  beat until killed (hints apply only while an agent beats)
  run        policy loop with heartbeat              --policy static --file W.json | --policy proportional [--capacity sout=X,sup=Y]
  gc         reclaim slots of dead processes

every command takes --path (default $MPIB_SHM_PATH or /dev/shm/mpib-hints)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmds := map[string]func([]string, io.Writer) error{
		"create": cmdCreate, "list": cmdList, "set": cmdSet, "top": cmdTop,
		"heartbeat": cmdHeartbeat, "daemon": cmdHeartbeat, "run": cmdRun, "gc": cmdGC,
	}
	name := os.Args[1]
	if name == "-h" || name == "--help" || name == "help" {
		fmt.Print(usage)
		return
	}
	cmd, ok := cmds[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "mpib-agent: unknown command %q\n\n%s", name, usage)
		os.Exit(2)
	}
	if err := cmd(os.Args[2:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintf(os.Stderr, "mpib-agent %s: %v\n", name, err)
		os.Exit(1)
	}
}

func defaultPath() string {
	if p := os.Getenv("MPIB_SHM_PATH"); p != "" {
		return p
	}
	return shm.DefaultPath
}

func newFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("mpib-agent "+name, flag.ContinueOnError)
	path := fs.String("path", defaultPath(), "segment file")
	return fs, path
}

// parseAndOpen parses a subcommand's flags, then opens the segment that --path names.
func parseAndOpen(fs *flag.FlagSet, args []string, path *string) (*shm.Segment, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return shm.Open(*path)
}

func warn(err error) {
	fmt.Fprintf(os.Stderr, "mpib-agent: warning: %v\n", err)
}

// report prints a clamp as a warning and passes other errors on.
func report(err error) error {
	if errors.Is(err, shm.ErrHintClamped) {
		warn(err)
		return nil
	}
	return err
}

func cmdCreate(args []string, out io.Writer) error {
	fs, path := newFlags("create")
	slots := fs.Uint("slots", shm.DefaultSlots, "connection slots (1..65536)")
	peers := fs.Uint("peers", shm.DefaultPeers, "per-peer default entries (0..4096)")
	force := fs.Bool("force", false, "replace an existing segment (detaches running plugins)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := os.Stat(*path); err == nil && !*force {
		return fmt.Errorf("%s exists (use --force to replace it)", *path)
	}
	s, err := shm.Create(*path, uint32(*slots), uint32(*peers))
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(out, "created %s: %d slots, %d peers, %d bytes, mode 0600\n", *path, *slots, *peers,
		shm.TotalSize(uint32(*slots), uint32(*peers)))
	return nil
}

func cmdGC(args []string, out io.Writer) error {
	fs, path := newFlags("gc")
	s, err := parseAndOpen(fs, args, path)
	if err != nil {
		return err
	}
	defer s.Close()
	freed, err := s.GC(nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "reclaimed %d slot(s) %v\n", len(freed), freed)
	return nil
}
