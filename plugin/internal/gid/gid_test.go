package gid

import (
	"net/netip"
	"testing"

	"github.com/mpib/mpib/plugin/internal/config"
)

func roce(addr string, typ int) Entry {
	return Entry{Present: true, GID: netip.MustParseAddr(addr).As16(), Type: typ}
}

func v4(addr string, typ int) Entry {
	return Entry{Present: true, GID: netip.AddrFrom4(netip.MustParseAddr(addr).As4()).As16(), Type: typ}
}

// A typical RoCE port: link-local v1/v2, then the IPv4 address v1/v2, then a VLAN address.
var table = []Entry{
	roce("fe80::1", TypeRoCEv1), roce("fe80::1", TypeRoCEv2),
	v4("10.0.1.11", TypeRoCEv1), v4("10.0.1.11", TypeRoCEv2),
	v4("192.168.5.11", TypeRoCEv1), v4("192.168.5.11", TypeRoCEv2),
	roce("fd00::11", TypeRoCEv2), {},
}

func TestChooseRoCE(t *testing.T) {
	v2 := config.GIDPolicy{RoCEVersion: 2}
	// A soft-RoCE-sized table (1024 entries): a v1 address at 7, v2 addresses at 300 and 301.
	long := make([]Entry, 1024)
	long[7] = v4("10.0.1.11", TypeRoCEv1)
	long[300], long[301] = v4("10.0.1.12", TypeRoCEv2), v4("10.0.1.13", TypeRoCEv2)
	tests := []struct {
		name  string
		table []Entry
		index int
		p     config.GIDPolicy
		want  int
	}{
		{"first IPv4 RoCE v2", table, -1, v2, 3},
		{"RoCE v1 preferred", table, -1, config.GIDPolicy{RoCEVersion: 1}, 2},
		{"range picks the VLAN", table, -1, config.GIDPolicy{RoCEVersion: 2, Range: netip.MustParsePrefix("192.168.0.0/16")}, 5},
		{"IPv6 family", table, -1, config.GIDPolicy{RoCEVersion: 2, IPv6: true}, 6},
		{"configured index wins", table, 4, v2, 4},
		{"only v1 present: v1 rather than nothing", []Entry{roce("fe80::1", TypeRoCEv1), v4("10.0.1.11", TypeRoCEv1)}, -1, v2, 1},
		{"link-local only", []Entry{roce("fe80::1", TypeRoCEv2)}, -1, v2, -1},
		{"range excludes all", table, -1, config.GIDPolicy{RoCEVersion: 2, Range: netip.MustParsePrefix("172.16.0.0/12")}, -1},
		{"configured index empty", table, 7, v2, -1},
		{"configured index beyond table", table, 9, v2, -1},
		{"zero GID skipped", []Entry{roce("::", TypeRoCEv2), v4("10.0.1.11", TypeRoCEv2)}, -1, v2, 1},
		{"auto never picks above 255 (8-bit sgid_index)", long, -1, v2, 7},
		{"only above 255: refused, not truncated", long[8:], -1, v2, -1},
		{"configured index above 255 refused", long, 300, v2, -1},
	}
	for _, tt := range tests {
		got, err := ChooseRoCE(tt.table, tt.index, tt.p)
		if got != tt.want || (tt.want < 0) != (err != nil) {
			t.Errorf("%s: got %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
}

func TestChooseIB(t *testing.T) {
	plain := roce("fe80::2:c903:1", TypeIB)
	flid := roce("fe80:0:0:0:2:c903:0:1", TypeIB)
	withFLID := Entry{Present: true, GID: [16]byte{0xfe, 0x80, 0, 0, 0x12, 0x34, 0, 7, 0, 2, 0xc9, 3, 0, 0, 0, 1}}
	tests := []struct {
		name  string
		table []Entry
		want  int
	}{
		{"index 1 has a FLID", []Entry{plain, withFLID}, 1},
		{"no FLID: index 0", []Entry{plain, flid}, 0},
		{"one entry", []Entry{plain}, 0},
		{"empty table", nil, -1},
	}
	for _, tt := range tests {
		got, err := ChooseIB(tt.table)
		if got != tt.want || (tt.want < 0) != (err != nil) {
			t.Errorf("%s: got %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
}

func TestSupReachable(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name      string
		local     string
		lbits     uint8
		peer      string
		pbits     uint8
		reachable bool
	}{
		{"same /24", "10.9.1.11", 24, "10.9.1.12", 24, true},
		{"other island's SUP subnet", "10.9.1.11", 24, "10.9.2.11", 24, false},
		{"peer's narrower subnet excludes us", "10.9.1.11", 16, "10.9.1.200", 30, false},
		{"unknown prefix on one side: island rule decides", "10.9.1.11", 0, "10.9.2.11", 24, true},
		{"IPv6 same /64", "fd00::11", 64, "fd00::12", 64, true},
		{"IPv6 vs IPv4", "fd00::11", 64, "10.9.1.12", 24, false},
	}
	for _, tt := range tests {
		if got := SupReachable(a(tt.local), tt.lbits, a(tt.peer), tt.pbits); got != tt.reachable {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.reachable)
		}
	}
}
