package policy

import (
	"errors"
	"testing"

	"github.com/mpib/mpib/agent/go/shm"
)

type call struct {
	kind  string
	key   string
	value uint32
}

type fake struct{ calls []call }

func (f *fake) SetSlotHint(slot uint32, v uint32, _ bool) error {
	f.calls = append(f.calls, call{"slot", shm.IPv4(slot).String(), v})
	if v > shm.SupBwMax {
		return &shm.ClampedError{Requested: v, Applied: shm.SupBwMax}
	}
	return nil
}

func (f *fake) SetPeerHint(ip shm.IPv4, plen uint8, v uint32, _ bool) error {
	f.calls = append(f.calls, call{"peer", ip.String(), v})
	return nil
}

func (f *fake) SetClassHint(c shm.PathClass, v uint32, _ bool) error {
	f.calls = append(f.calls, call{"class", c.String(), v})
	return nil
}

func TestParseWeights(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"full", `{"class":{"intra":1024,"inter":0},"peers":{"10.0.2.7":256,"10.0.2.0/24":512},"conns":{"3":700,"42:7":1}}`, true},
		{"empty", `{}`, true},
		{"unknown field", `{"klass":{}}`, false},
		{"bad class", `{"class":{"outer":1}}`, false},
		{"bad peer", `{"peers":{"10.0.2":1}}`, false},
		{"bad prefix", `{"peers":{"10.0.2.0/33":1}}`, false},
		{"bad conn", `{"conns":{"x":1}}`, false},
		{"negative", `{"class":{"intra":-1}}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseWeights([]byte(tc.in))
			if (err == nil) != tc.ok {
				t.Fatalf("expected ok=%v but got %v", tc.ok, err)
			}
			if err != nil && !errors.Is(err, ErrBadWeights) {
				t.Fatalf("expected ErrBadWeights but got %v", err)
			}
		})
	}
}

func TestApply(t *testing.T) {
	w, err := ParseWeights([]byte(`{"class":{"inter":0},"peers":{"10.0.2.0/24":512},"conns":{"1":5000,"42:7":100,"9":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	conns := []shm.Slot{{Index: 1, PID: 1, ConnID: 1}, {Index: 2, PID: 42, ConnID: 7}}
	f := &fake{}
	warnings, err := w.Apply(f, conns)
	if err != nil {
		t.Fatal(err)
	}
	want := []call{{"class", "inter", 0}, {"peer", "10.0.2.0", 512}, {"slot", "0.0.0.1", 5000}, {"slot", "0.0.0.2", 100}}
	if len(f.calls) != len(want) {
		t.Fatalf("expected %v but got %v", want, f.calls)
	}
	for i := range want {
		if f.calls[i] != want[i] {
			t.Errorf("call %d: expected %v but got %v", i, want[i], f.calls[i])
		}
	}
	if len(warnings) != 2 || !errors.Is(warnings[0], shm.ErrHintClamped) || !errors.Is(warnings[1], shm.ErrSlotInactive) {
		t.Fatalf("warnings: %v", warnings)
	}
}

func TestProportional(t *testing.T) {
	rate := func(sout, sup float64) []shm.ConnRate { return []shm.ConnRate{{SoutBps: sout, SupBps: sup}} }
	tests := []struct {
		name string
		p    Proportional
		obs  [][]shm.ConnRate
		want uint32
	}{
		{"configured 1:3", Proportional{CapSout: 100, CapSup: 300}, nil, 768},
		{"configured sup only", Proportional{CapSup: 1}, nil, 1024},
		{"configured sout only", Proportional{CapSout: 1}, nil, 0},
		{"nothing measured", Proportional{}, nil, 512},
		{"measured 1:1", Proportional{}, [][]shm.ConnRate{rate(50, 50)}, 512},
		{"measured 1:3", Proportional{}, [][]shm.ConnRate{rate(25, 75)}, 768},
		{"measured sup only: bounded", Proportional{}, [][]shm.ConnRate{rate(0, 100)}, 960},
		{"measured sout only: bounded", Proportional{}, [][]shm.ConnRate{rate(100, 0)}, 64},
		{"peaks kept", Proportional{Decay: 1}, [][]shm.ConnRate{rate(100, 0), rate(0, 300)}, 768},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, o := range tc.obs {
				tc.p.Observe(o)
			}
			if got := tc.p.SupBw(); got != tc.want {
				t.Fatalf("expected %d but got %d", tc.want, got)
			}
		})
	}
}
