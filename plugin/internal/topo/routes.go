package topo

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"
)

// Flags of /proc/net/route (include/uapi/linux/route.h).
const (
	rtfUp      = 0x0001
	rtfGateway = 0x0002
	rtfReject  = 0x0200
)

// ParseProcRoute reads the kernel's main IPv4 routing table as /proc/net/route shows it (what
// `ip route` lists without `table`): the routes ChooseSupPairs and CheckAcceptedPair consult
// when MPIB_SUP_RELAY=1. Routes that are down or reject (unreachable, prohibit) are left out.
// Policy routing (other tables, `ip rule`) is not seen. The file prints each address as the
// host's u32 of its network-order bytes: order is the host's byte order (binary.NativeEndian;
// a parameter so both orders are tested).
func ParseProcRoute(r io.Reader, order binary.ByteOrder) ([]Route, error) {
	sc := bufio.NewScanner(r)
	var routes []Route
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if line == 1 || len(f) == 0 { // the header
			continue
		}
		rt, ok, err := parseRouteLine(f, order)
		if err != nil {
			return nil, fmt.Errorf("/proc/net/route line %d: %w", line, err)
		}
		if ok {
			routes = append(routes, rt)
		}
	}
	return routes, sc.Err()
}

// parseRouteLine reads Iface Destination Gateway Flags RefCnt Use Metric Mask ...; ok is false
// for a route the kernel would not forward on.
func parseRouteLine(f []string, order binary.ByteOrder) (Route, bool, error) {
	if len(f) < 8 {
		return Route{}, false, fmt.Errorf("%d fields, want at least 8", len(f))
	}
	var v [4]uint32 // destination, gateway, flags, mask
	for i, col := range []int{1, 2, 3, 7} {
		x, err := strconv.ParseUint(f[col], 16, 32)
		if err != nil {
			return Route{}, false, fmt.Errorf("field %d %q: %w", col+1, f[col], err)
		}
		v[i] = uint32(x)
	}
	addr := func(x uint32) netip.Addr {
		var b [4]byte
		order.PutUint32(b[:], x)
		return netip.AddrFrom4(b)
	}
	mask := binary.BigEndian.Uint32(addr(v[3]).AsSlice())
	ones := bits.LeadingZeros32(^mask)
	if mask<<ones != 0 {
		return Route{}, false, fmt.Errorf("mask %v is not a prefix", addr(v[3]))
	}
	if v[2]&rtfUp == 0 || v[2]&rtfReject != 0 {
		return Route{}, false, nil
	}
	rt := Route{Dst: netip.PrefixFrom(addr(v[0]), ones).Masked(), Dev: f[0]}
	if v[2]&rtfGateway != 0 {
		rt.Via = addr(v[1])
	}
	return rt, true, nil
}
