package topo

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		local, peer string
		prefix      int
		want        PathClass
	}{
		{"10.0.1.11", "10.0.1.12", 24, IntraIsland},
		{"10.0.1.11", "10.0.2.11", 24, InterIsland},
		{"10.0.1.11", "10.0.2.11", 16, IntraIsland},
		{"10.0.1.11", "10.0.1.11", 32, IntraIsland},
		{"10.0.1.11", "10.0.1.12", 32, InterIsland},
		{"10.0.1.11", "192.168.0.1", 0, IntraIsland},
		{"10.0.1.127", "10.0.1.128", 25, InterIsland},
		{"10.0.1.1", "10.0.1.126", 25, IntraIsland},
	}
	for _, tt := range tests {
		l, p := netip.MustParseAddr(tt.local), netip.MustParseAddr(tt.peer)
		got, err := Classify(l, p, tt.prefix)
		if err != nil || got != tt.want {
			t.Errorf("Classify(%s, %s, /%d) = %v, %v; want %v", tt.local, tt.peer, tt.prefix, got, err, tt.want)
		}
		// Both ends compute the same answer.
		if back, _ := Classify(p, l, tt.prefix); back != got {
			t.Errorf("Classify is not symmetric for %s and %s", tt.local, tt.peer)
		}
	}
}

func TestClassifyRejects(t *testing.T) {
	if _, err := Classify(netip.MustParseAddr("::1"), netip.MustParseAddr("10.0.0.1"), 24); err == nil {
		t.Error("IPv6 accepted")
	}
	if _, err := Classify(netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.1"), 33); err == nil {
		t.Error("prefix 33 accepted")
	}
}

func TestIsland(t *testing.T) {
	if got := Island(netip.MustParseAddr("10.0.2.12"), 24); got != 0x0A000200 {
		t.Errorf("Island = %#x, want 0x0a000200", got)
	}
}
