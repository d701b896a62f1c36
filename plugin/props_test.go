package main

import (
	"slices"
	"testing"

	"github.com/mpib/mpib/plugin/internal/config"
)

// Every fused device's name is its own (NCCL's topology finds net nodes by name), and a
// configuration that names each HCA with one port keeps the names it always had.
func TestPropNamesDistinct(t *testing.T) {
	rail := func(hca string, port int) config.Rail { return config.Rail{HCA: hca, Port: port} }
	dev := func(sout config.Rail, sups ...config.Rail) config.Device {
		return config.Device{Sout: sout, Sup: sups[0], SupPorts: sups}
	}
	tests := []struct {
		name string
		devs []config.Device
		want []string
	}{
		{"a NIC pair per GPU, SUP NICs shared by two", []config.Device{
			dev(rail("mlx5_0", 1), rail("sup0", 1)), dev(rail("mlx5_1", 1), rail("sup0", 1)),
			dev(rail("mlx5_2", 1), rail("sup1", 1)), dev(rail("mlx5_3", 1), rail("sup1", 1))},
			[]string{"mpib[mlx5_0+sup0]", "mpib[mlx5_1+sup0]", "mpib[mlx5_2+sup1]", "mpib[mlx5_3+sup1]"}},
		{"both ports of one HCA as SOUT, one SUP NIC", []config.Device{
			dev(rail("mlx5_0", 1), rail("mlx5_4", 1)), dev(rail("mlx5_0", 2), rail("mlx5_4", 1))},
			[]string{"mpib[mlx5_0:1+mlx5_4]", "mpib[mlx5_0:2+mlx5_4]"}},
		{"a mesh device", []config.Device{dev(rail("mlx5_0", 1), rail("mlx5_8", 1), rail("mlx5_9", 1))},
			[]string{"mpib[mlx5_0+mlx5_8+mlx5_9]"}},
		{"SOUT and SUP on two ports of one HCA", []config.Device{dev(rail("mlx5_0", 1), rail("mlx5_0", 2))},
			[]string{"mpib[mlx5_0:1+mlx5_0:2]"}},
	}
	for _, tt := range tests {
		multi := multiPortHCAs(tt.devs)
		seen := map[string]bool{}
		for i, d := range tt.devs {
			got := propName(d, multi)
			if got != tt.want[i] || seen[got] {
				t.Errorf("%s: device %d named %q, want %q (distinct)", tt.name, i, got, tt.want[i])
			}
			seen[got] = true
		}
	}
}

// A fused device advertises DMA-BUF only when every one of its NICs takes it: regMrDmaBuf
// registers on SOUT and on each SUP port, and NCCL aborts when it fails.
func TestDmabufLacking(t *testing.T) {
	// NICs 0-1 mlx5 (DMA-BUF), 2 rxe (none), 3 mlx5; NIC 4 is not open.
	nicOK := []bool{true, true, false, true}
	tests := []struct {
		name string
		nics []int // SOUT, then the SUP ports
		want []int
	}{
		{"SOUT and SUP both take it", []int{0, 1}, nil},
		{"SUP lacks it (only NIC 0 was probed before)", []int{0, 2}, []int{2}},
		{"SOUT lacks it", []int{2, 0}, []int{2}},
		{"a mesh device, one SUP port of three lacks it", []int{0, 1, 3, 2}, []int{2}},
		{"a mesh device, every port takes it", []int{1, 0, 3}, nil},
		{"a NIC that is not open", []int{0, 4}, []int{4}},
	}
	for _, tt := range tests {
		got := dmabufLacking(nicOK, tt.nics)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s: NICs %v lacking DMA-BUF: got %v, want %v", tt.name, tt.nics, got, tt.want)
		}
	}
}
