package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/mpib/mpib/agent/go/doctor"
)

// The command over the doctor's doctorFixture trees (agent/go/doctor/testdata).

var doctorFixture = filepath.Join("..", "..", "doctor", "testdata", "roce-2dev")

func setEnv(t *testing.T, kv ...string) {
	for _, k := range []string{"MPIB_HCA_SOUT", "MPIB_HCA_SUP", "MPIB_OOB_IF", "MPIB_GID_INDEX_SUP", "MPIB_GID_INDEX_SOUT",
		"NCCL_IB_GID_INDEX", "MPIB_ISLAND_PREFIX_LEN", "MPIB_MODE", "MPIB_SUP_RELAY"} {
		t.Setenv(k, "")
	}
	for _, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		t.Setenv(k, v)
	}
}

func runDoctor(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := cmdDoctor(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestDoctorExitStatus(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		args []string
		exit int
		has  string
	}{
		{"healthy", []string{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=eth0"}, nil, 0, " problems=0 exit=0\n"},
		{"a misspelt setting is a note", []string{"MPIB_HCA_SOUT=mlx5_0,mlx5_2", "MPIB_HCA_SUP=mlx5_1,mlx5_3", "MPIB_OOB_IF=eth0", "MPIB_SOUT_QPS=4"}, nil, 0,
			"doctor: note=config variable=MPIB_SOUT_QPS"},
		{"wrong HCA name", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=nosuch", "MPIB_OOB_IF=eth0"}, nil, 1, "doctor: problem=no-device device=0 rail=SUP port=nosuch:1"},
		{"invalid configuration", []string{"MPIB_HCA_SOUT=mlx5_0", "MPIB_OOB_IF=eth0"}, nil, 2, "doctor: problem=config want=a valid MPIB configuration: MPIB_HCA_SUP is required"},
		{"--listen and --peer", nil, []string{"--listen", ":1", "--peer", "h:1"}, 2, ""},
		{"bad --bw-seconds", nil, []string{"--bw-seconds", "x"}, 2, ""},
		{"bad address", nil, []string{"--peer", "nohostport"}, 2, ""},
		{"stray argument", nil, []string{"extra"}, 2, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			setEnv(t, c.env...)
			code, out, errOut := runDoctor(append([]string{"--root", doctorFixture}, c.args...)...)
			if code != c.exit || !strings.Contains(out, c.has) {
				t.Errorf("exit %d, want %d; output\n%s%s", code, c.exit, out, errOut)
			}
		})
	}
}

func TestDoctorJSON(t *testing.T) {
	setEnv(t, "MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0", "MPIB_GID_INDEX_SUP=0")
	code, out, _ := runDoctor("--root", doctorFixture, "--json")
	var doc doctor.Document
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--json printed no JSON document: %v\n%s", err, out)
	}
	if code != 1 || doc.Exit != 1 || len(doc.Report.Problems) != 1 || doc.Report.Problems[0].Kind != doctor.KindGID {
		t.Errorf("exit %d, document %+v", code, doc)
	}
}

// Two doctors on loopback, one listening, one connecting, without traffic tests: the peer
// reads the fixture with another OOB address, as a second node would have.
func TestDoctorPair(t *testing.T) {
	setEnv(t, "MPIB_HCA_SOUT=mlx5_0", "MPIB_HCA_SUP=mlx5_1", "MPIB_OOB_IF=eth0")
	for _, side := range doctorPairRun(t, doctorFixture, otherNode(t)) {
		if side.code != 0 || !strings.Contains(side.out, " rail=SUP class=intra-island used=true path=direct mtu=4096/4096 reachable=unknown mbps=none speed_mbps=200000 why=traffic_test_off_(--bw-seconds_0)") {
			t.Errorf("exit %d\n%s%s", side.code, side.out, side.errs)
		}
	}
	// One OOB address on both: each node's connects would reach itself.
	for _, side := range doctorPairRun(t, doctorFixture, doctorFixture) {
		if side.code != 1 || !strings.Contains(side.out, "doctor: problem=oob-if oob_if=eth0/eth0 address=10.0.1.11/10.0.1.11 want=a different OOB address on each node") {
			t.Errorf("one OOB address on both nodes: exit %d\n%s%s", side.code, side.out, side.errs)
		}
	}
}

type doctorSide struct {
	code      int
	out, errs string
}

// doctorPairRun runs a listening doctor over the fixture tree at listenRoot and a connecting
// one over peerRoot.
func doctorPairRun(t *testing.T, listenRoot, peerRoot string) [2]doctorSide {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var wg sync.WaitGroup
	var l doctorSide
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.code, l.out, l.errs = runDoctor("--root", listenRoot, "--listen", addr, "--wait", "20s", "--bw-seconds", "0")
	}()
	var p doctorSide
	p.code, p.out, p.errs = runDoctor("--root", peerRoot, "--peer", addr, "--wait", "20s", "--bw-seconds", "0")
	wg.Wait()
	return [2]doctorSide{l, p}
}

// otherNode is the doctor fixture as another node of its island: the same tree (linked),
// with 10.0.1.12 as eth0's first address, which MPIB_OOB_IF=eth0 then gives.
func otherNode(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs(doctorFixture)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "ip-addr" {
			if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(root, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	addrs, err := os.ReadFile(filepath.Join(src, "ip-addr"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "ip-addr"), append([]byte("eth0 10.0.1.12/24\n"), addrs...), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}
