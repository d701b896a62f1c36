package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mpib/mpib/integration/perftest"
)

// WriteBW is one perftest ib_write_bw run between two nodes on one rail.
type WriteBW struct {
	Server, Client *Node
	Rail           Rail
	PeerRail       Rail          // the server's rail when its name differs (a mesh cable's far end); default Rail
	Size           int           // message size in bytes (default 65536)
	Iters          int           // iterations (default 500)
	Port           int           // TCP port of perftest's out-of-band exchange (default 18515)
	Timeout        time.Duration // bound on the client (default 60 s)
	TxDepth        int           // perftest --tx-depth: writes in flight (0: perftest's default, 128)
	NoCounters     bool          // skip the rail counters (six execs fewer: benchmarks)
}

// WriteBWResult is what a WriteBW run measured.
type WriteBWResult struct {
	Gbps         float64       // perftest's "BW average[MB/sec]" in Gbit/s
	MsgRate      float64       // perftest's "MsgRate[Mpps]" in messages per second
	Wall         time.Duration // client wall time
	ClientStdout string
	ClientCode   int
	ServerCode   int
	Output       string   // both sides' output, for failure messages
	ClientRail   Counters // deltas on the client's rail during the run
	ServerRail   Counters
	ClientOther  Counters // deltas on the client's other rail
	payload      int64
}

// Run runs the server then the client (the client's out-of-band TCP goes to the server's
// SOUT address, the RDMA traffic over Rail's devices and RoCE v2 GIDs). A client that
// cannot connect is not an error: the result carries its exit code. err is for harness
// failures.
func (w WriteBW) Run(ctx context.Context) (*WriteBWResult, error) {
	// perftest now and then prints inf for every figure under TCG (its CPU-frequency
	// estimate came out as zero): that run measured nothing, so it runs again.
	for attempt := 1; ; attempt++ {
		res, err := w.runOnce(ctx)
		if !errors.Is(err, perftest.ErrNoFigure) || attempt == 3 {
			return res, err
		}
		fmt.Printf("lab: ib_write_bw %s -> %s on %s printed no figure (attempt %d); running it again\n",
			w.Client.Name(), w.Server.Name(), w.Rail, attempt)
	}
}

func (w WriteBW) runOnce(ctx context.Context) (*WriteBWResult, error) {
	if w.Size == 0 {
		w.Size = 65536
	}
	if w.Iters == 0 {
		w.Iters = 500
	}
	if w.Port == 0 {
		w.Port = 18515
	}
	if w.Timeout == 0 {
		w.Timeout = 60 * time.Second
	}
	if w.PeerRail == "" {
		w.PeerRail = w.Rail
	}
	other := SOUT
	if w.Rail == SOUT {
		other = SUP
	}
	args := func(n *Node, r Rail) []string {
		a := []string{"ib_write_bw", "-d", n.Dev(r), "-x", strconv.Itoa(n.GIDIndex(r)), "-F",
			"-s", strconv.Itoa(w.Size), "-n", strconv.Itoa(w.Iters), "-p", strconv.Itoa(w.Port)}
		if w.TxDepth > 0 {
			a = append(a, "--tx-depth", strconv.Itoa(w.TxDepth))
		}
		return a
	}
	var cBefore, sBefore, oBefore Counters
	var err error
	if !w.NoCounters {
		if cBefore, err = w.Client.Counters(ctx, w.Rail); err != nil {
			return nil, err
		}
		if sBefore, err = w.Server.Counters(ctx, w.PeerRail); err != nil {
			return nil, err
		}
		if oBefore, err = w.Client.Counters(ctx, other); err != nil {
			return nil, err
		}
	}
	srv, err := w.Server.Start(ctx, nil, append([]string{"timeout", strconv.Itoa(int(w.Timeout.Seconds()) + 10)}, args(w.Server, w.PeerRail)...)...)
	if err != nil {
		return nil, err
	}
	defer srv.Kill(context.WithoutCancel(ctx))
	if err := w.Server.waitListen(ctx, w.Port, 20*time.Second); err != nil {
		return nil, err
	}
	start := time.Now()
	cargs := append([]string{"timeout", strconv.Itoa(int(w.Timeout.Seconds()))}, args(w.Client, w.Rail)...)
	cout, cerr, ccode, err := w.Client.Exec(ctx, nil, append(cargs, w.Server.IP(SOUT))...)
	if err != nil {
		return nil, err
	}
	res := &WriteBWResult{Wall: time.Since(start), ClientStdout: cout, ClientCode: ccode,
		payload: int64(w.Size) * int64(w.Iters)}
	var sout, serr string
	if ccode == 0 {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		sout, serr, res.ServerCode, err = srv.Wait(wctx)
		cancel()
		if err != nil {
			return nil, err
		}
	} else {
		res.ServerCode = -1
	}
	res.Output = fmt.Sprintf("client (%s):\n%s%s\nserver (%s):\n%s%s", w.Client.Name(), cout, cerr, w.Server.Name(), sout, serr)
	if !w.NoCounters {
		if res.ClientRail, err = delta(ctx, w.Client, w.Rail, cBefore); err != nil {
			return nil, err
		}
		if res.ServerRail, err = delta(ctx, w.Server, w.PeerRail, sBefore); err != nil {
			return nil, err
		}
		if res.ClientOther, err = delta(ctx, w.Client, other, oBefore); err != nil {
			return nil, err
		}
	}
	if ccode == 0 {
		res.Gbps, res.MsgRate, err = perftest.BWLine(cout)
		if err != nil {
			return nil, fmt.Errorf("%w\n%s", err, res.Output)
		}
	}
	return res, nil
}

// WallGbps is the payload over the client's wall time (connection set-up included).
func (r *WriteBWResult) WallGbps() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.payload) * 8 / r.Wall.Seconds() / 1e9
}

func delta(ctx context.Context, n *Node, r Rail, before Counters) (Counters, error) {
	after, err := n.Counters(ctx, r)
	if err != nil {
		return Counters{}, err
	}
	return after.Sub(before), nil
}

// waitListen waits until a TCP port listens in the node.
func (n *Node) waitListen(ctx context.Context, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		out, _, _, err := n.Exec(ctx, nil, "ss", "-Hltn", "sport = :"+strconv.Itoa(port))
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) != "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: nothing listens on port %d after %v", n.name, port, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
