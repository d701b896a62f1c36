package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Text output: every line starts with "doctor: " and is key=value fields, so that scripts and
// the lab test read them by key. A problem line ends with "want=WHAT: FIX" (free text).

// Document is what --json prints: the node's report, the pair checks when run with a peer
// (the peer's report too), and the exit status.
type Document struct {
	Report       Report     `json:"report"`
	Peer         *Report    `json:"peer,omitempty"`
	Pairs        []PairRail `json:"pairs,omitempty"`
	PairProblems []Problem  `json:"pair_problems,omitempty"`
	Exit         int        `json:"exit"`
}

// WriteJSON prints the document as one indented JSON object.
func WriteJSON(w io.Writer, doc Document) error {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// WriteReport prints a node's lines: the node, each port, each problem, each note.
func WriteReport(w io.Writer, r Report) {
	if r.Config == "" {
		fmt.Fprintln(w, NodeLine(r))
		for _, d := range r.Devices {
			fmt.Fprintln(w, PortLine(r, d.Index, d.Sout))
			for _, p := range d.Sup {
				fmt.Fprintln(w, PortLine(r, d.Index, p))
			}
		}
	}
	for _, p := range r.Problems {
		fmt.Fprintln(w, ProblemLine(p))
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, NoteLine(n))
	}
}

// WritePairs prints the pair checks: one line per device and rail, then their problems.
func WritePairs(w io.Writer, rails []PairRail, problems []Problem) {
	for _, pr := range rails {
		fmt.Fprintln(w, PairLine(pr))
	}
	for _, p := range problems {
		fmt.Fprintln(w, ProblemLine(p))
	}
}

// WriteSummary prints the last line: the node, the number of problems and the exit status.
func WriteSummary(w io.Writer, node string, problems, exit int) {
	fmt.Fprintf(w, "doctor: node=%s problems=%d exit=%d\n", node, problems, exit)
}

// NodeLine is the node's facts: control interface, address, island, settings, GPUs, nettest.
func NodeLine(r Report) string {
	gpus := "none"
	if len(r.GPUs) > 0 {
		s := make([]string, len(r.GPUs))
		for i, g := range r.GPUs {
			s[i] = g.PCI
		}
		gpus = strings.Join(s, ",")
	}
	island := "none"
	if r.OOB.Island.IsValid() {
		island = r.OOB.Island.String()
	}
	nt := r.Nettest.Path
	if nt == "" {
		nt = "none"
	}
	return fmt.Sprintf("doctor: node=%s oob_if=%s address=%s island=%s prefix_len=%d mode=%d sup_relay=%d devices=%d gpus=%s nettest=%s",
		r.Node, r.OOB.Interface, addrOrNone(r.OOB.Addr), island, r.IslandPrefixLen, r.Mode, boolInt(r.SupRelay),
		len(r.Devices), gpus, nt)
}

// PortLine is one port's facts.
func PortLine(r Report, dev int, p Port) string {
	head := fmt.Sprintf("doctor: device=%d rail=%s port=%s", dev, p.Rail, p.Name())
	if !p.Found {
		return head + " state=missing"
	}
	gpu := "none"
	if len(r.GPUs) > 0 {
		gpu = orNone(p.GPU)
	}
	s := fmt.Sprintf("%s state=%s mtu=%s link_layer=%s gid_index=%s address=%s numa=%d gpu=%s netdev=%s netdev_mtu=%s speed_mbps=%d pci=%s",
		head, p.State, known(p.ActiveMTU), p.LinkLayer, indexName(p.GIDIndex), addrOrNone(p.Addr), p.NUMA, gpu,
		orNone(p.Netdev), known(p.NetdevMTU), p.SpeedMbps, orNone(p.PCI))
	if p.Rail == "SUP" {
		s += " routes=" + listOrNone(p.SupRoutes)
	}
	return s
}

// ProblemLine is one problem: "doctor: problem=KIND [device= rail= port=] FACTS want=WANT: FIX".
func ProblemLine(p Problem) string { return findingLine("problem", p) }

// NoteLine is one note, as a problem line with note= for problem=.
func NoteLine(n Problem) string { return findingLine("note", n) }

func findingLine(label string, p Problem) string {
	var b strings.Builder
	b.WriteString("doctor: " + label + "=" + p.Kind)
	if p.Device >= 0 {
		b.WriteString(" device=" + strconv.Itoa(p.Device))
	}
	if p.Rail != "" {
		b.WriteString(" rail=" + p.Rail)
	}
	if p.Port != "" {
		b.WriteString(" port=" + p.Port)
	}
	for _, f := range p.Facts {
		b.WriteString(" " + f)
	}
	b.WriteString(" want=" + noNewline(p.Want) + ": " + noNewline(p.Fix))
	return b.String()
}

// PairLine is one rail between the two nodes.
func PairLine(pr PairRail) string {
	mbps := "none"
	if pr.Mbps >= 0 {
		mbps = strconv.FormatFloat(pr.Mbps, 'f', 1, 64)
	}
	s := fmt.Sprintf("doctor: pair=%s device=%d rail=%s class=%s used=%t path=%s mtu=%s/%s reachable=%s mbps=%s speed_mbps=%d",
		pr.Pair, pr.Device, pr.Rail, pr.Class, pr.Used, pr.Path, known(pr.MTU[0]), known(pr.MTU[1]), pr.Reachable, mbps, pr.SpeedMbps)
	if pr.Why != "" {
		s += " why=" + noSpace(pr.Why)
	}
	return s
}

func known(n int) string {
	if n <= 0 {
		return "unknown"
	}
	return strconv.Itoa(n)
}
