package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestListenTarget(t *testing.T) {
	for _, tc := range []struct {
		listen      string
		allowRemote bool
		network     string // "" : refused (a usage error)
	}{
		{defaultListen, false, "tcp"},
		{"127.0.0.1:0", false, "tcp"},
		{"127.1.2.3:9877", false, "tcp"},
		{"[::1]:9877", false, "tcp"},
		{"[::ffff:127.0.0.1]:9877", false, "tcp"},
		{"localhost:9877", false, "tcp"},
		{":9877", false, ""},            // every interface
		{"0.0.0.0:9877", false, ""},     // every interface
		{"[::]:9877", false, ""},        // every interface
		{"10.0.0.5:9877", false, ""},    // a reachable address
		{"gpu-node-01:9877", false, ""}, // a name: who knows where it points
		{":9877", true, "tcp"},
		{"10.0.0.5:9877", true, "tcp"},
		{"unix:/run/mpib/metrics.sock", false, "unix"},
		{"unix:", false, ""},
		{"9877", false, ""},
		{"9877", true, ""},
	} {
		network, address, err := listenTarget(tc.listen, tc.allowRemote)
		if tc.network == "" {
			if errCode(err) != "usage" {
				t.Errorf("listenTarget(%q, %v): expected a usage error but got %q %q %v", tc.listen, tc.allowRemote, network, address, err)
			}
			continue
		}
		want := strings.TrimPrefix(tc.listen, unixPrefix)
		if err != nil || network != tc.network || address != want {
			t.Errorf("listenTarget(%q, %v): expected %q %q but got %q %q %v", tc.listen, tc.allowRemote, tc.network, want, network, address, err)
		}
	}
}

// The refusal names the flag that overrides it and what a scrape exposes.
func TestListenTargetMessage(t *testing.T) {
	_, _, err := listenTarget(":9877", false)
	if err == nil || !strings.Contains(err.Error(), "--allow-remote") || !strings.Contains(err.Error(), "unauthenticated") {
		t.Errorf("refusal message: %v", err)
	}
}

// Export with no --listen serves on loopback: the default is taken, not refused, and a unix:
// socket is created for its owner only.
func TestExportDefaultsAndUnixSocket(t *testing.T) {
	if _, _, err := listenTarget(defaultListen, false); err != nil {
		t.Fatalf("the default --listen is refused: %v", err)
	}
	if h, _, _ := net.SplitHostPort(defaultListen); !isLoopbackHost(h) {
		t.Fatalf("the default --listen %s is not loopback", defaultListen)
	}
	sock := filepath.Join(t.TempDir(), "m.sock")
	ln, err := listenExport("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	st, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", st.Mode().Perm())
	}
}

// Export on a unix: socket serves /metrics there (and stops on SIGTERM like the TCP one).
func TestExportUnixServes(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "m.sock")
	done := make(chan error, 1)
	var out bytes.Buffer
	go func() {
		done <- cmdExport([]string{"--listen", unixPrefix + sock, "--path", filepath.Join(dir, "absent")}, &out)
	}()
	var c net.Conn
	var err error
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("no unix socket: %v", err)
	}
	c.Write([]byte("GET /metrics HTTP/1.0\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var resp bytes.Buffer
	resp.ReadFrom(c)
	c.Close()
	if !strings.Contains(resp.String(), "mpib_segment_up 0") {
		t.Errorf("scrape over the unix socket:\n%s", resp.String())
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	if err := <-done; err != nil {
		t.Errorf("export ended with %v", err)
	}
}
