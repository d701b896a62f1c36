package dist

import (
	"reflect"
	"testing"
)

func TestViolations(t *testing.T) {
	so := "lib/libnccl-net-mpib.so"
	cases := []struct {
		name  string
		needs []Need
		want  []string
	}{
		{"nothing", nil, nil},
		{"baseline exactly", []Need{
			{File: so, Library: "libc.so.6"},
			{File: so, Symbol: "pthread_create", Library: "libpthread.so.0", Version: "GLIBC_2.2.5"},
			{File: so, Symbol: "getrandom", Library: "libc.so.6", Version: "GLIBC_2.25"},
			{File: so, Library: "libc.so.6", Version: "GLIBC_2.28"},
			{File: so, Symbol: "ibv_open_device", Library: "libibverbs.so.1", Version: "IBVERBS_1.1"},
			{File: so, Symbol: "ibv_fork_init", Library: "libibverbs.so.1", Version: "IBVERBS_1.0"},
			{File: so, Symbol: "__cxa_finalize"}, // unversioned
		}, nil},
		{"three-part glibc node below the limit", []Need{{File: so, Symbol: "memcpy", Library: "libc.so.6", Version: "GLIBC_2.3.2"}}, nil},
		{"glibc 2.34 pthread_create", []Need{{File: so, Symbol: "pthread_create", Library: "libc.so.6", Version: "GLIBC_2.34"}},
			[]string{so + ": pthread_create from libc.so.6 needs GLIBC_2.34, newer than GLIBC_2.28"}},
		{"2.28.1 is past 2.28", []Need{{File: so, Library: "libc.so.6", Version: "GLIBC_2.28.1"}},
			[]string{so + ": libc.so.6 needs GLIBC_2.28.1, newer than GLIBC_2.28"}},
		{"2.3 is not 2.30", []Need{{File: so, Library: "libc.so.6", Version: "GLIBC_2.3"}}, nil},
		{"version node alone", []Need{{File: so, Library: "libm.so.6", Version: "GLIBC_2.29"}},
			[]string{so + ": libm.so.6 needs GLIBC_2.29, newer than GLIBC_2.28"}},
		{"private glibc node", []Need{{File: so, Symbol: "_dl_x", Library: "ld-linux-x86-64.so.2", Version: "GLIBC_PRIVATE"}},
			[]string{so + ": _dl_x from ld-linux-x86-64.so.2 needs node GLIBC_PRIVATE: not a public GLIBC node"}},
		{"newer ibverbs node", []Need{{File: so, Symbol: "ibv_query_ece", Library: "libibverbs.so.1", Version: "IBVERBS_1.13"}},
			[]string{so + ": ibv_query_ece from libibverbs.so.1 needs IBVERBS_1.13, newer than IBVERBS_1.1"}},
		{"provider library", []Need{{File: so, Library: "libmlx5.so.1"}, {File: so, Symbol: "mlx5dv_query_device", Library: "libmlx5.so.1", Version: "MLX5_1.0"}},
			[]string{so + ": needs libmlx5.so.1: only glibc and libibverbs.so.1 may be needed"}},
		{"foreign node from glibc", []Need{{File: so, Symbol: "x", Library: "libc.so.6", Version: "IBVERBS_1.1"}},
			[]string{so + ": x from libc.so.6 needs node IBVERBS_1.1: not a public GLIBC node"}},
		{"libstdc++", []Need{{File: "bin/mpib-nettest", Library: "libstdc++.so.6"}},
			[]string{"bin/mpib-nettest: needs libstdc++.so.6: only glibc and libibverbs.so.1 may be needed"}},
		{"duplicates reported once", []Need{
			{File: so, Symbol: "dlopen", Library: "libc.so.6", Version: "GLIBC_2.34"},
			{File: so, Symbol: "dlopen", Library: "libc.so.6", Version: "GLIBC_2.34"},
		}, []string{so + ": dlopen from libc.so.6 needs GLIBC_2.34, newer than GLIBC_2.28"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Violations(c.needs, Baseline)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("got %q\nwant %q", got, c.want)
			}
		})
	}
}

func TestViolationsBadLimits(t *testing.T) {
	for _, l := range []Limits{{Glibc: "2.28", Ibverbs: "IBVERBS_1.1"}, {Glibc: "GLIBC_2.28", Ibverbs: "IBVERBS_x"}, {}} {
		if _, err := Violations(nil, l); err == nil {
			t.Errorf("limits %+v accepted", l)
		}
	}
}

func TestMaxNode(t *testing.T) {
	needs := []Need{
		{Library: "libc.so.6", Version: "GLIBC_2.3.2"},
		{Library: "libc.so.6", Version: "GLIBC_2.17"},
		{Library: "libc.so.6", Version: "GLIBC_2.9"},
		{Library: "libc.so.6", Version: "GLIBC_PRIVATE"},
		{Library: "libibverbs.so.1", Version: "IBVERBS_1.0"},
		{Library: "libibverbs.so.1", Version: "IBVERBS_1.1"},
		{Library: "libc.so.6"},
	}
	for prefix, want := range map[string]string{"GLIBC_": "GLIBC_2.17", "IBVERBS_": "IBVERBS_1.1", "MLX5_": ""} {
		if got := MaxNode(needs, prefix); got != want {
			t.Errorf("MaxNode(%s) = %q, want %q", prefix, got, want)
		}
	}
}
