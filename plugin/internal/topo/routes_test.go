package topo

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// procLine writes one /proc/net/route line as a host of the given byte order prints it.
func procLine(order binary.ByteOrder, dev, dst, via string, flags uint32, mask string) string {
	hex := func(a string) string {
		if a == "" {
			return "00000000"
		}
		return fmt.Sprintf("%08X", order.Uint32(netip.MustParseAddr(a).AsSlice()))
	}
	return fmt.Sprintf("%s\t%s\t%s\t%04X\t0\t0\t0\t%s\t0\t0\t0", dev, hex(dst), hex(via), flags, hex(mask))
}

const procHeader = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"

func TestParseProcRoute(t *testing.T) {
	// This machine's file, as read on an x86 host (little-endian).
	le := procHeader + "\n" +
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n" +
		"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
	got, err := ParseProcRoute(strings.NewReader(le), binary.LittleEndian)
	want := []Route{route("0.0.0.0/0", "192.0.2.1", "eth0"), route("192.0.2.0/24", "", "eth0")}
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	// Lab b1 (island B ring, relay routes), on both byte orders: a /32 host route, a /29, a
	// down route and an unreachable one (left out).
	for _, order := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		lines := []string{procHeader,
			procLine(order, "to-b2", "10.9.112.0", "", rtfUp, "255.255.255.0"),
			procLine(order, "to-b2", "10.9.123.0", "10.9.112.2", rtfUp|rtfGateway, "255.255.255.0"),
			procLine(order, "to-b4", "10.9.134.3", "10.9.141.4", rtfUp|rtfGateway|0x4, "255.255.255.255"),
			procLine(order, "to-a3", "10.9.13.0", "", rtfUp, "255.255.255.248"),
			procLine(order, "to-b4", "10.9.99.0", "10.9.141.4", rtfGateway, "255.255.255.0"),
			procLine(order, "lo", "10.9.98.0", "", rtfUp|rtfReject, "255.255.255.0"),
			"",
		}
		got, err := ParseProcRoute(strings.NewReader(strings.Join(lines, "\n")), order)
		want := []Route{route("10.9.112.0/24", "", "to-b2"), route("10.9.123.0/24", "10.9.112.2", "to-b2"),
			route("10.9.134.3/32", "10.9.141.4", "to-b4"), route("10.9.13.0/29", "", "to-a3")}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%v: got %v, %v\nwant %v", order, got, err, want)
		}
	}
}

func TestParseProcRouteRejects(t *testing.T) {
	for _, line := range []string{
		"eth0\t00000000\t010200C0\t0003",                                            // too few fields
		"eth0\tZZ000000\t010200C0\t0003\t0\t0\t0\t00000000",                         // not hex
		procLine(binary.LittleEndian, "eth0", "10.9.0.0", "", rtfUp, "255.0.255.0"), // not a prefix
	} {
		if r, err := ParseProcRoute(strings.NewReader(procHeader+"\n"+line), binary.LittleEndian); err == nil {
			t.Errorf("%q: parsed %v", line, r)
		}
	}
}
