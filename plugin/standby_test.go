package main

import (
	"testing"

	"github.com/mpib/mpib/plugin/internal/config"
	"github.com/mpib/mpib/plugin/internal/topo"
)

// TestStandbyDeferred: only a vanilla intra-island sender with SUP up, failover and a
// ride-through defers its SOUT rail; every other connection builds it with the handshake.
func TestStandbyDeferred(t *testing.T) {
	base := config.Config{StandbyDefer: true, Mode: 0, ForceSupBW: -1, Failover: true, StallTimeoutMS: 30000}
	tests := []struct {
		name                 string
		mut                  func(*config.Config)
		isSend, withSup, sup bool
		path                 topo.PathClass
		want                 bool
	}{
		{"vanilla intra-island sender", nil, true, true, true, topo.IntraIsland, true},
		{"the receiver follows the sender", nil, false, true, true, topo.IntraIsland, false},
		{"inter-island: SOUT carries it", nil, true, false, true, topo.InterIsland, false},
		{"no SUP QPs", nil, true, false, true, topo.IntraIsland, false},
		{"SUP port down", nil, true, true, false, topo.IntraIsland, false},
		{"advanced mode: the agent may use SOUT", func(c *config.Config) { c.Mode = 1 }, true, true, true, topo.IntraIsland, false},
		{"a forced split uses SOUT", func(c *config.Config) { c.ForceSupBW = 512 }, true, true, true, topo.IntraIsland, false},
		{"a forced all-SUP split", func(c *config.Config) { c.ForceSupBW = 1024 }, true, true, true, topo.IntraIsland, true},
		{"MPIB_STANDBY_DEFER=0", func(c *config.Config) { c.StandbyDefer = false }, true, true, true, topo.IntraIsland, false},
		{"MPIB_FAILOVER=0", func(c *config.Config) { c.Failover = false }, true, true, true, topo.IntraIsland, false},
		{"no ride-through", func(c *config.Config) { c.StallTimeoutMS = 0 }, true, true, true, topo.IntraIsland, false},
	}
	for _, tt := range tests {
		cfg := base
		if tt.mut != nil {
			tt.mut(&cfg)
		}
		if got := standbyDeferred(cfg, tt.isSend, tt.path, tt.withSup, func() bool { return tt.sup }); got != tt.want {
			t.Errorf("%s: standbyDeferred = %v, want %v", tt.name, got, tt.want)
		}
	}
}
