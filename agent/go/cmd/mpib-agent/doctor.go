package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/mpib/mpib/agent/go/doctor"
	"github.com/mpib/mpib/plugin/rules"
)

// mpib-agent doctor: the preflight check of docs/deploying.md ("Before the first job").
// Exit status: 0 healthy, 1 problems found (each printed as a problem= line), 2 the
// configuration itself is invalid or the command line is wrong.

const doctorUsage = `usage: mpib-agent doctor [--json] [--listen ADDR:PORT | --peer HOST:PORT] [flags]

Checks this node against the MPIB_* / NCCL_IB_* environment a job would use: every fused
device's SOUT and SUP ports (link state, MTU, GID the plugin would pick, verbs device,
P_Key index, PCI place, NUMA node, nearest GPU), the island of MPIB_OOB_IF's address, the
SUP routes. With --listen on one node and --peer on another, the two exchange reports and
check what needs both ends (settings, island, MTU per rail, routes per rail), then run
mpib-nettest per rail when it is found (the doctor's port + 1, + 2, ... carry its side
channels).
`

// doctorFlags are the command line's values.
type doctorFlags struct {
	json                 bool
	listen, peer         string
	wait, timeout        time.Duration
	bwSeconds            int
	nettest, plugin      string
	root                 string
	nettestTimeoutSecond int
}

func parseDoctorFlags(args []string, stderr io.Writer) (doctorFlags, error) {
	var f doctorFlags
	fs := flag.NewFlagSet(prog+" doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, doctorUsage); fs.PrintDefaults() }
	fs.BoolVar(&f.json, "json", false, "print one JSON document instead of lines")
	fs.StringVar(&f.listen, "listen", "", "wait for the other node's doctor on ADDR:PORT")
	fs.StringVar(&f.peer, "peer", "", "exchange with the doctor listening on HOST:PORT")
	waitS := fs.String("wait", "120s", "how long to wait for the other node")
	timeoutS := fs.String("timeout", "10s", "deadline of each step of the exchange")
	bwS := fs.String("bw-seconds", "2", "seconds of traffic per rail with --listen/--peer (0: no traffic test)")
	fs.StringVar(&f.nettest, "nettest", "", "mpib-nettest to run (default: beside mpib-agent, then PATH)")
	fs.StringVar(&f.plugin, "plugin", "", "plugin for mpib-nettest (default: beside mpib-agent or in ../lib, else the loader's path)")
	fs.StringVar(&f.root, "root", "/", "read sys/ and proc/ under this directory (a fixture tree; interface addresses then come from ROOT/ip-addr)")
	if err := parse(fs, args); err != nil {
		return f, err
	}
	var err error
	if f.wait, err = parseDuration("wait", *waitS); err != nil {
		return f, err
	}
	if f.timeout, err = parseDuration("timeout", *timeoutS); err != nil {
		return f, err
	}
	bw, err := parseInt("bw-seconds", *bwS)
	if err != nil {
		return f, err
	}
	if bw < 0 || bw > 600 {
		return f, usagef("--bw-seconds %d: want 0..600", bw)
	}
	f.bwSeconds, f.nettestTimeoutSecond = int(bw), 30
	if f.listen != "" && f.peer != "" {
		return f, usagef("--listen and --peer: give one (--listen on one node, --peer on the other)")
	}
	for _, a := range []string{f.listen, f.peer} {
		if _, _, err := net.SplitHostPort(a); a != "" && err != nil {
			return f, usagef("%q: want HOST:PORT (%v)", a, err)
		}
	}
	return f, nil
}

// cmdDoctor runs the doctor and returns the exit status.
func cmdDoctor(args []string, stdout, stderr io.Writer) int {
	f, err := parseDoctorFlags(args, stderr)
	if err != nil {
		return report("doctor", err)
	}
	host := doctor.LiveHost()
	if f.root != "/" {
		host = doctor.FixtureHost(f.root, host.Name)
	}
	host.Nettest = doctor.FindNettest(f.nettest, f.plugin)
	mine := doctor.Inspect(host, os.Getenv)
	mine.Notes = append(mine.Notes, doctor.ConfigNotes(rules.UnknownSettings(os.Environ()))...)
	doc := doctor.Document{Report: mine}
	if f.listen != "" || f.peer != "" {
		runPair(&doc, f, stderr)
	}
	problems := len(mine.Problems) + len(doc.PairProblems)
	doc.Exit = doctor.Exit(mine, doc.PairProblems)
	if f.json {
		if err := doctor.WriteJSON(stdout, doc); err != nil {
			fmt.Fprintf(stderr, "%s doctor: %v\n", prog, err)
			return doctor.ExitProblems
		}
		return doc.Exit
	}
	doctor.WriteReport(stdout, mine)
	doctor.WritePairs(stdout, doc.Pairs, doc.PairProblems)
	doctor.WriteSummary(stdout, mine.Node, problems, doc.Exit)
	return doc.Exit
}

// runPair exchanges reports with the other node, checks the pair and runs the traffic
// tests; a failed exchange is a problem of its own (kind peer).
func runPair(doc *doctor.Document, f doctorFlags, stderr io.Writer) {
	ctx := context.Background()
	mine := doc.Report
	var s *doctor.Session
	var theirs doctor.Report
	var err error
	addr := f.listen
	if f.listen != "" {
		s, theirs, err = doctor.Listen(ctx, f.listen, f.wait, f.timeout, mine, stderr)
	} else {
		addr = f.peer
		s, theirs, err = doctor.Dial(ctx, f.peer, f.wait, f.timeout, mine)
	}
	if err != nil {
		doc.PairProblems = append(doc.PairProblems, peerProblem(err))
		return
	}
	defer s.Close()
	doc.Peer = &theirs
	a, b := mine, theirs
	if f.peer != "" {
		a, b = theirs, mine
	}
	doc.Pairs, doc.PairProblems = doctor.ComparePair(a, b)
	doc.PairProblems = append(doc.PairProblems, doctor.PeerProblems(theirs)...)
	hostPart, portPart, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portPart)
	t := doctor.Traffic{Session: s, Node: mine.Node, Nettest: mine.Nettest, Peer: theirs, Seconds: f.bwSeconds,
		Timeout: f.nettestTimeoutSecond, Host: hostPart, Port: port, Env: os.Environ(), Run: doctor.RunNettest}
	if f.listen != "" {
		err = t.Lead(ctx, doc.Pairs)
	} else {
		err = t.Follow(ctx, doc.Pairs)
	}
	if err != nil {
		doctor.SkipAll(doc.Pairs, "traffic tests stopped: "+err.Error())
		doc.PairProblems = append(doc.PairProblems, peerProblem(err))
	}
	doc.PairProblems = append(doc.PairProblems, doctor.TrafficProblems(doc.Pairs)...)
}

func peerProblem(err error) doctor.Problem {
	return doctor.Problem{Kind: doctor.KindPeer, Device: -1, Want: "the other node's doctor (--listen on one node, --peer on the other)",
		Fix: err.Error()}
}
