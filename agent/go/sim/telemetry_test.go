//go:build linux

package sim_test

import (
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/sim"
)

// TestCompletionTelemetry: the simulator publishes the plugin's completion telemetry from its
// rail model, so an agent reads the same fields against it as against a live plugin: per
// rail completed bytes at the modelled rate, the per-rail completion latency, one message's
// part in flight, the applied split; and a rail that fails carries nothing more.
func TestCompletionTelemetry(t *testing.T) {
	seg, err := shm.Create(filepath.Join(t.TempDir(), "seg"), 4, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	const msg = 4 << 20
	conns := []sim.Conn{{PathClass: shm.InterIsland, MsgBytes: msg,
		Rails: [2]sim.Rail{{Mbps: 10000, Latency: 20 * time.Microsecond}, {Mbps: 30000, Latency: 50 * time.Microsecond}}}}
	events := []sim.Event{{At: 2 * time.Second, Conn: 0, Rail: 1, Mbps: 30000, State: shm.RailDown}}
	s, err := sim.New(seg, sim.Config{Noise: -1, SupRelay: true}, conns, events) // inter-island: SUP needs the relay
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	seg.SetClassHint(shm.InterIsland, 512, true)
	a := shm.NewSample(s.Now(), mustConns(t, seg))
	if err := s.Run(time.Second, time.Second, func(uint64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	b := shm.NewSample(s.Now(), mustConns(t, seg))
	r := shm.Rates(a, b)
	if len(r) != 1 {
		t.Fatalf("rates: %+v", r)
	}
	// Half on each rail: SOUT's half takes 20 us + 2 MiB at 10 Gb/s, the message as long.
	tSout := 20e-6 + float64(msg/2)*8/10e9
	tSup := 50e-6 + float64(msg/2)*8/30e9
	near := func(got, want float64) bool { return math.Abs(got-want) <= 0.01*want }
	if !near(r[0].SoutCompletedBps, msg/2/tSout) || !near(r[0].SupCompletedBps, msg/2/tSout) {
		t.Errorf("completed rates %v and %v, want %v each", r[0].SoutCompletedBps, r[0].SupCompletedBps, msg/2/tSout)
	}
	if !near(r[0].SoutLatencyNs, tSout*1e9) || !near(r[0].SupLatencyNs, tSup*1e9) {
		t.Errorf("latencies %v and %v ns, want %v and %v", r[0].SoutLatencyNs, r[0].SupLatencyNs, tSout*1e9, tSup*1e9)
	}
	tel := b.Slots[r[0].Slot.Index].Telemetry
	if tel.SoutInflightBytes != msg/2 || tel.SupInflightBytes != msg/2 || tel.AppliedSupBw != 512 || tel.FlushWallNs == 0 {
		t.Errorf("gauges: %+v", tel)
	}
	if tel.SoutBytes < tel.SoutCompletedBytes || tel.SoutBytes-tel.SoutCompletedBytes > msg/2+1 {
		t.Errorf("posted %d and completed %d SOUT bytes differ by more than the in-flight part", tel.SoutBytes, tel.SoutCompletedBytes)
	}
	if err := s.Run(2*time.Second, time.Second, func(uint64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	c := shm.NewSample(s.Now(), mustConns(t, seg))
	if err := s.Run(time.Second, time.Second, func(uint64) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d := shm.NewSample(s.Now(), mustConns(t, seg))
	tel = d.Slots[r[0].Slot.Index].Telemetry
	if rs := shm.Rates(c, d); len(rs) != 1 || rs[0].SupCompletedBps != 0 || tel.SupInflightBytes != 0 || tel.AppliedSupBw != 0 { // all on SOUT
		t.Errorf("after SUP failed: %+v %+v", rs, tel)
	}
}

func mustConns(t *testing.T, seg *shm.Segment) []shm.Slot {
	t.Helper()
	c, err := seg.Connections()
	if err != nil {
		t.Fatal(err)
	}
	return c
}
