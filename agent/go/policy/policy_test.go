package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/mpib/mpib/agent/go/shm"
)

type call struct {
	kind  string
	key   string
	value uint32
	valid bool
}

type fake struct {
	calls []call
	gens  map[uint32]uint32 // slot -> current gen (missing: inactive)
}

func (f *fake) SetSlotHint(slot, gen uint32, v uint32, valid bool) error {
	if f.gens != nil {
		cur, ok := f.gens[slot]
		if !ok {
			return shm.ErrSlotInactive
		}
		if cur != gen {
			return &shm.GenChangedError{Slot: slot, Expected: gen, Current: cur}
		}
	}
	f.calls = append(f.calls, call{"slot", fmt.Sprintf("%d/%d", slot, gen), v, valid})
	if v > shm.SupBwMax {
		return &shm.ClampedError{Requested: v, Applied: shm.SupBwMax}
	}
	return nil
}

func (f *fake) SetPeerHint(ip shm.IPv4, plen uint8, v uint32, valid bool) error {
	f.calls = append(f.calls, call{"peer", fmt.Sprintf("%v/%d", ip, plen), v, valid})
	return nil
}

func (f *fake) SetClassHint(c shm.PathClass, v uint32, valid bool) error {
	f.calls = append(f.calls, call{"class", c.String(), v, valid})
	return nil
}

func TestParseWeights(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"full", `{"class":{"intra":1024,"inter":0},"peers":{"10.0.2.7":256,"10.0.2.0/24":512},"conns":{"3":700,"42:7":1}}`, true},
		{"empty", `{}`, true},
		{"above 1024 (clamped on write)", `{"class":{"intra":5000}}`, true},
		{"beyond uint32", `{"class":{"intra":99999999999}}`, true},
		{"unknown field", `{"klass":{}}`, false},
		{"bad class", `{"class":{"outer":1}}`, false},
		{"bad peer", `{"peers":{"10.0.2":1}}`, false},
		{"bad prefix", `{"peers":{"10.0.2.0/33":1}}`, false},
		{"bad conn", `{"conns":{"x":1}}`, false},
		{"signed conn", `{"conns":{"+3":1}}`, false},
		{"negative", `{"class":{"intra":-1}}`, false},
		{"fraction", `{"class":{"intra":512.5}}`, false},
		{"fraction .0", `{"class":{"intra":512.0}}`, false},
		{"exponent", `{"class":{"intra":1e3}}`, false},
		{"bool", `{"class":{"intra":true}}`, false},
		{"null value", `{"class":{"intra":null}}`, false},
		{"null section", `{"class":null}`, false},
		{"array", `[]`, false},
		{"trailing data", `{} {}`, false},
		{"half written", `{"class":{"intra":10`, false},
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

// A file that says two things of one target is refused, naming both keys: encoding/json
// keeps the last of a duplicate key, and two aliases would both be applied in map order.
func TestParseWeightsDuplicates(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"class key twice", `{"class":{"intra":1,"intra":2}}`, `bad_weights: duplicate key "intra"`},
		{"section twice", `{"class":{"intra":1},"class":{"inter":2}}`, `bad_weights: duplicate key "class"`},
		{"inner duplicate first", `{"class":{},"class":{"0":1,"0":2}}`, `bad_weights: duplicate key "0"`},
		{"class aliases", `{"class":{"0":700,"intra":5}}`, `bad_weights: class "0" and "intra" name the same target: keep one`},
		{"class in two cases", `{"class":{"Inter":7,"inter":5}}`, `bad_weights: class "Inter" and "inter" name the same target: keep one`},
		{"peer aliases", `{"peers":{"10.0.2.7":900,"10.0.2.7/32":100}}`, `bad_weights: peers "10.0.2.7" and "10.0.2.7/32" name the same target: keep one`},
		{"prefix aliases", `{"peers":{"10.0.2.0/08":1,"10.0.2.0/8":2}}`, `bad_weights: peers "10.0.2.0/08" and "10.0.2.0/8" name the same target: keep one`},
		{"island aliases", `{"peers":{"10.0.2.0/24":1,"10.0.2.7/24":2}}`, `bad_weights: peers "10.0.2.0/24" and "10.0.2.7/24" name the same target: keep one`},
		{"conn aliases", `{"conns":{"03":1,"3":2}}`, `bad_weights: conns "03" and "3" name the same target: keep one`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := ParseWeights([]byte(tc.in))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("got %+v, %v; want error %q", w, err, tc.want)
			}
		})
	}
	if _, err := ParseWeights([]byte(`{"peers":{"10.0.2.7":1,"10.0.2.7/24":2,"10.0.2.0/16":3}}`)); err != nil {
		t.Fatalf("distinct peers refused: %v", err)
	}
}

// Defect 7 (static policy): a deleted key clears its hint, conns entries reach connections
// that appear later, a half-saved file keeps the last good weights with one warning.
func TestStatic(t *testing.T) {
	file := filepath.Join(t.TempDir(), "w.json")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		now := time.Now().Add(time.Duration(len(s)) * time.Millisecond) // a distinct mtime per write
		os.Chtimes(file, now, now)
	}
	p := &Static{File: file}
	f := &fake{gens: map[uint32]uint32{1: 5}}
	conn := func(i, gen, pid uint32, id uint64) shm.Slot {
		return shm.Slot{Index: i, Gen: gen, PID: pid, ConnID: id}
	}
	if _, _, err := p.Tick(f, nil); !errors.Is(err, ErrBadWeights) {
		t.Fatalf("missing file at start: expected ErrBadWeights but got %v", err)
	}
	write(`{"class":{"inter":0},"peers":{"10.0.2.0/24":512},"conns":{"1":5000,"42:7":100}}`)
	_, warnings, err := p.Tick(f, []shm.Slot{conn(1, 5, 1, 1)})
	if err != nil {
		t.Fatal(err)
	}
	want := []call{{"class", "inter", 0, true}, {"peer", "10.0.2.0/24", 512, true}, {"slot", "1/5", 5000, true}}
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("expected %v but got %v", want, f.calls)
	}
	if len(warnings) != 2 || !errors.Is(warnings[0], shm.ErrHintClamped) {
		t.Fatalf("warnings (clamp, 42:7 missing): %v", warnings)
	}
	// Nothing changed: nothing written. Then 42:7 connects (slot 2).
	f.calls = nil
	p.Tick(f, []shm.Slot{conn(1, 5, 1, 1)})
	f.gens[2] = 9
	_, warnings, _ = p.Tick(f, []shm.Slot{conn(1, 5, 1, 1), conn(2, 9, 42, 7)})
	if want := []call{{"slot", "2/9", 100, true}}; !reflect.DeepEqual(f.calls, want) || len(warnings) != 0 {
		t.Fatalf("a connection that appears later: expected %v but got %v (%v)", want, f.calls, warnings)
	}
	// Slot 1 is registered again: written again with its new gen.
	f.calls = nil
	f.gens[1] = 6
	p.Tick(f, []shm.Slot{conn(1, 6, 1, 2), conn(2, 9, 42, 7)})
	if want := []call{{"slot", "1/6", 5000, true}}; !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("re-registered slot: expected %v but got %v", want, f.calls)
	}
	// Half-saved file: the last good weights stay, one warning.
	f.calls = nil
	write(`{"class":{"inter":`)
	_, w1, err1 := p.Tick(f, []shm.Slot{conn(1, 6, 1, 2), conn(2, 9, 42, 7)})
	_, w2, err2 := p.Tick(f, []shm.Slot{conn(1, 6, 1, 2), conn(2, 9, 42, 7)})
	if err1 != nil || err2 != nil || len(w1) != 1 || !errors.Is(w1[0], ErrBadWeights) || len(w2) != 0 || len(f.calls) != 0 {
		t.Fatalf("half-saved file: %v %v %v %v %v", err1, err2, w1, w2, f.calls)
	}
	// Keys deleted: their hints are cleared (the connection returns to the default).
	write(`{"class":{"inter":0}}`)
	if _, _, err := p.Tick(f, []shm.Slot{conn(1, 6, 1, 2), conn(2, 9, 42, 7)}); err != nil {
		t.Fatal(err)
	}
	want = []call{{"peer", "10.0.2.0/24", 0, false}, {"slot", "2/9", 0, false}, {"slot", "1/6", 0, false}, {"class", "inter", 0, true}}
	sortCalls := func(c []call) {
		sort.SliceStable(c, func(i, j int) bool { return c[i].kind+c[i].key < c[j].kind+c[j].key })
	}
	sortCalls(want)
	sortCalls(f.calls)
	if !reflect.DeepEqual(f.calls, want) {
		t.Fatalf("deleted keys: expected %v but got %v", want, f.calls)
	}
}

func TestParseConnSelector(t *testing.T) {
	for _, s := range []string{"", "x", "-1", "+3", "1:", ":1", "1:2:3", "4294967296", "1:18446744073709551616", " 3"} {
		if _, err := ParseConnSelector(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
	if c, err := ParseConnSelector("4242:7"); err != nil || !c.ByPIDConnID || c.PID != 4242 || c.ConnID != 7 {
		t.Fatalf("4242:7: %+v %v", c, err)
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
