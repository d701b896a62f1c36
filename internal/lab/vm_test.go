package lab

import (
	"net"
	"strconv"
	"testing"
)

// A rebooted lab keeps its Docker port when it is free (the harness's retry depends on it:
// testcontainers-go reads DOCKER_HOST once per process), and gets another one when it is not.
func TestFreePortKeepsTheWantedPort(t *testing.T) {
	any, err := freePort(0)
	if err != nil || any == 0 {
		t.Fatalf("freePort(0) = %d, %v", any, err)
	}
	got, err := freePort(any)
	if err != nil || got != any {
		t.Fatalf("freePort(%d) with the port free = %d, %v; want the same port", any, got, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(any))
	if err != nil {
		t.Skipf("the port was taken meanwhile (%v): nothing to check", err)
	}
	defer l.Close()
	got, err = freePort(any)
	if err != nil || got == any || got == 0 {
		t.Fatalf("freePort(%d) with the port in use = %d, %v; want another free port", any, got, err)
	}
}
