//go:build linux

package sim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mpib/mpib/agent/go/policy"
	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/sim"
)

// Run the closed-loop policy on the "2:1" scenario for a simulated minute and compare each
// send connection with the best split. Any policy fits here: read seg.Connections() at the
// virtual time now, write hints through seg.
func Example() {
	dir, _ := os.MkdirTemp("", "mpib-sim")
	defer os.RemoveAll(dir)
	seg, err := shm.Create(filepath.Join(dir, "hints"), 16, 4, false)
	if err != nil {
		panic(err)
	}
	defer seg.Close()
	sc := sim.Scenarios()[1]
	s, err := sim.New(seg, sim.Config{Seed: 1}, sc.Conns, sc.Events)
	if err != nil {
		panic(err)
	}
	defer s.Close()
	p := &policy.ClosedLoop{}
	err = s.Run(time.Minute, 500*time.Millisecond, func(now uint64) error {
		conns, err := seg.Connections()
		if err != nil {
			return err
		}
		_, err = p.Tick(seg, now, conns)
		return err
	})
	if err != nil {
		panic(err)
	}
	for i, c := range sc.Conns {
		if c.Recv {
			continue
		}
		opt, _ := s.OptimumOf(i)
		fmt.Printf("conn %d: split %d, optimum %d, %.0f%% of the optimal bytes\n", i, s.Split(i), opt,
			100*s.Delivered(i)/s.Optimal(i))
	}
	// Output:
	// conn 0: split 683, optimum 683, 99% of the optimal bytes
	// conn 1: split 341, optimum 341, 99% of the optimal bytes
}
