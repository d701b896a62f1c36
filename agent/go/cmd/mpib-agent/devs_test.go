package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
	"github.com/mpib/mpib/agent/go/shm/emulate"
)

// TestDevFilter: connections of three fused devices; list, top and record show each one's
// device and NICs, and --dev keeps the named devices' connections only.
func TestDevFilter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hints")
	if err := cmdCreate([]string{"--path", path, "--slots", "8", "--peers", "2"}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	plug := attachPlugin(t, path)
	ip, _ := shm.ParseIPv4("10.0.1.2")
	for i, dev := range []uint16{0, 1, 1, 7} {
		nics := [2]string{"mlx5_" + string(rune('0'+dev)), "mlx5_sup"}
		if _, err := plug.Register(emulate.ConnDesc{PeerSoutIP: ip, IsSend: true, PID: 99, ConnID: uint64(i + 1), Dev: dev,
			Ports: [2]uint8{1, 2}, NICs: nics}); err != nil {
			t.Fatal(err)
		}
	}
	listDevs := func(args ...string) map[uint16]int {
		var out bytes.Buffer
		if err := cmdList(append([]string{"--path", path, "--json"}, args...), &out); err != nil {
			t.Fatalf("list %v: %v", args, err)
		}
		var views []connView
		if err := json.Unmarshal(out.Bytes(), &views); err != nil {
			t.Fatal(err)
		}
		got := map[uint16]int{}
		for _, v := range views {
			got[v.Dev]++
			if v.SoutNIC != "mlx5_"+string(rune('0'+v.Dev)) || v.SupNIC != "mlx5_sup" || v.SupPort != 2 {
				t.Errorf("list: slot %d of dev %d shows NICs %s:%d/%s:%d", v.Index, v.Dev, v.SoutNIC, v.SoutPort, v.SupNIC, v.SupPort)
			}
		}
		return got
	}
	for _, tc := range []struct {
		args []string
		want map[uint16]int
	}{
		{nil, map[uint16]int{0: 1, 1: 2, 7: 1}},
		{[]string{"--dev", "1"}, map[uint16]int{1: 2}},
		{[]string{"--dev", "0,7"}, map[uint16]int{0: 1, 7: 1}},
		{[]string{"--dev", "0", "--dev", "1"}, map[uint16]int{0: 1, 1: 2}},
		{[]string{"--dev", "3"}, map[uint16]int{}},
	} {
		if got := listDevs(tc.args...); !maps.Equal(got, tc.want) {
			t.Errorf("list %v: connections per device %v, want %v", tc.args, got, tc.want)
		}
	}
	var table bytes.Buffer
	if err := cmdList([]string{"--path", path, "--dev", "7"}, &table); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(table.String()), "\n"); len(lines) != 4 ||
		!strings.Contains(lines[1], "DEV") || !strings.Contains(lines[2], "mlx5_7/mlx5_sup:2") || lines[3] != "defaults: none" {
		t.Errorf("list --dev 7 table: want the status, the header, one row naming its NICs and the defaults:\n%s", table.String())
	}
	jl := filepath.Join(t.TempDir(), "rec.jsonl")
	if err := cmdRecord([]string{"--path", path, "--out", jl, "--count", "1", "--interval", "20ms", "--dev", "1"}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(jl)
	var sample topSample
	if err := json.Unmarshal(b, &sample); err != nil || len(sample.Conns) != 2 ||
		sample.Conns[0].Dev != 1 || sample.Conns[1].Dev != 1 || sample.Conns[0].SoutNIC != "mlx5_1" {
		t.Errorf("record --dev 1: want dev 1's two connections with their NICs, got %s (%v)", b, err)
	}
	var top bytes.Buffer
	if err := cmdTop([]string{"--path", path, "--count", "1", "--interval", "20ms", "--plain"}, &top); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(top.String(), "  dev   7 ") || !strings.Contains(top.String(), "  dev   1 ") {
		t.Errorf("top over several devices: want a line per device:\n%s", top.String())
	}
	for _, bad := range []string{"-1", "x", "65536", "1,", "", "+1", " 1", "1,,2"} {
		err := cmdList([]string{"--path", path, "--dev", bad}, &bytes.Buffer{})
		if _, ok := err.(usageError); !ok || !strings.Contains(err.Error(), "device index") {
			t.Errorf("list --dev %q: %v, want a usage error naming a device index", bad, err)
		}
	}
}
