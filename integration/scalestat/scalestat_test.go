package scalestat

import "testing"

func TestSetupSteps(t *testing.T) {
	for _, tc := range []struct {
		name, stderr, want string
	}{
		{"two comms",
			"x NCCL INFO NET/MPIB : send comm 1 <-> 2: intra, SOUT QPs 1, SUP QPs 1, CTS on SUP, traffic class 0, SL 0, setup ms: params=1.0 create=10.0 exchange=4.0\n" +
				"noise\n" +
				"y NCCL INFO NET/MPIB : recv comm 1 <-> 2: intra, SOUT QPs 1, SUP QPs 1, CTS on SUP, traffic class 0, SL 0, setup ms: params=3.0 create=30.0 exchange=2.0\n",
			"comms=2 params_ms=2.0/3.0 create_ms=20.0/30.0 exchange_ms=3.0/4.0 (mean/max per comm)"},
		{"a field that is not a number is left out",
			"send comm 1 <-> 2: setup ms: params=1.0 create=x\n",
			"comms=1 params_ms=1.0/1.0 (mean/max per comm)"},
		{"no comm", "noise\n", "comms=0 (mean/max per comm)"},
	} {
		if got := SetupSteps(tc.stderr); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
