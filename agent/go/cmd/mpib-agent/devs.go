package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/mpib/mpib/agent/go/shm"
)

// devList is the --dev flag of list, top and record: the fused devices (the slots' dev,
// format version 4) whose connections are shown; empty shows every connection.
type devList struct{ devs map[uint16]bool }

// devFlag registers --dev on fs.
func devFlag(fs *flag.FlagSet) *devList {
	d := &devList{}
	fs.Var(d, "dev", "only connections of these fused devices: N, a comma list, or the flag repeated (default: all)")
	return d
}

func (d *devList) String() string {
	if d == nil || len(d.devs) == 0 {
		return ""
	}
	var s []string
	for v := range d.devs {
		s = append(s, strconv.Itoa(int(v)))
	}
	return strings.Join(s, ",")
}

// Set adds a comma list of device indexes (0..65535).
func (d *devList) Set(s string) error {
	if d.devs == nil {
		d.devs = map[uint16]bool{}
	}
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(f, 10, 16) // digits only: no sign, no space (as mpib-agent-py)
		if err != nil {
			return fmt.Errorf("want device indexes 0..65535, comma-separated (--dev 0,1) or repeated (--dev 0 --dev 1)")
		}
		d.devs[uint16(v)] = true
	}
	return nil
}

// keeps says whether a connection of device dev is shown.
func (d *devList) keeps(dev uint16) bool { return d == nil || len(d.devs) == 0 || d.devs[dev] }

// filter keeps the rates of the connections d shows.
func (d *devList) filter(rates []shm.ConnRate) []shm.ConnRate {
	if d == nil || len(d.devs) == 0 {
		return rates
	}
	out := rates[:0:0]
	for _, r := range rates {
		if d.keeps(r.Slot.Dev) {
			out = append(out, r)
		}
	}
	return out
}

// nicPair is a connection's NICs as list shows them: SOUT/SUP, with ports other than 1.
func nicPair(s shm.Slot) string {
	name := func(n string, port uint8) string {
		if n == "" {
			n = "-"
		}
		if port > 1 {
			n += ":" + strconv.Itoa(int(port))
		}
		return n
	}
	return name(s.SoutNIC, s.SoutPort) + "/" + name(s.SupNIC, s.SupPort)
}
