package shm

import "testing"

func TestRates(t *testing.T) {
	sl := func(i, gen uint32, sout, sup uint64) Slot {
		return Slot{Index: i, Gen: gen, Telemetry: Telemetry{SoutBytes: sout, SupBytes: sup, SoutRequests: sout / 100, SupRequests: sup / 100}}
	}
	a := NewSample(1e9, []Slot{sl(0, 1, 0, 0), sl(1, 1, 1000, 0), sl(2, 1, 0, 0)})
	b := NewSample(3e9, []Slot{sl(0, 1, 2000, 6000), sl(1, 2, 10, 10), sl(3, 1, 5, 5)})
	got := Rates(a, b)
	if len(got) != 1 || got[0].Slot.Index != 0 {
		t.Fatalf("expected only slot 0 (same gen in both samples) but got %+v", got)
	}
	r := got[0]
	if r.SoutBps != 1000 || r.SupBps != 3000 || r.SupShare() != 0.75 || r.SupReqPerSec != 30 {
		t.Fatalf("rates: %+v share %v", r, r.SupShare())
	}
	if Rates(b, a) != nil {
		t.Fatal("reversed samples must give nothing")
	}
}
