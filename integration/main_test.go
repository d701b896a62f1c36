package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// topo is the topology every test of the package shares, brought up once by TestMain.
// It is nil when no lab could be had outside CI; labOrSkip then skips with labErr.
var (
	topo   *Topology
	labErr error
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	start := time.Now()
	topo, labErr = Start(ctx)
	if labErr != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "lab: FAIL: no lab in CI: %v\n", labErr)
			return 1
		}
		evidence("lab:", "unavailable, lab tests skip: %v", labErr)
	} else {
		evidence("lab:", "ready in %.1f s", time.Since(start).Seconds())
	}
	code := m.Run()
	if topo != nil {
		t0 := time.Now()
		if err := topo.Close(context.Background()); err != nil {
			fmt.Fprintf(os.Stderr, "lab: teardown: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
		evidence("lab:", "torn down in %.1f s", time.Since(t0).Seconds())
	}
	return code
}

// labOrSkip returns the shared topology, or skips the test (outside CI) saying why.
func labOrSkip(t testing.TB) *Topology {
	t.Helper()
	if topo == nil {
		t.Skipf("no soft-RoCE lab: %v", labErr)
	}
	return topo
}
