package doctor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Stray clients get an ERROR line within the step timeout and the listener keeps waiting;
// the real peer then exchanges reports with it.
func TestExchangeRefusesStrayClients(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	mine, theirs := Report{Version: Version, Node: "a1"}, Report{Version: Version, Node: "a2"}
	var log bytes.Buffer
	var mu sync.Mutex
	type result struct {
		s   *Session
		r   Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, r, err := ListenOn(context.Background(), ln, 20*time.Second, 300*time.Millisecond, mine, lockedWriter{&mu, &log})
		done <- result{s, r, err}
	}()
	huge := append([]byte(Hello), binary.BigEndian.AppendUint32(nil, 0xffffffff)...)
	for _, c := range []struct {
		name string
		send []byte
	}{
		{"http", []byte("GET / HTTP/1.0\r\n\r\n")},
		{"no newline", bytes.Repeat([]byte("x"), 1000)},
		{"huge frame", huge},
		{"not JSON", append(append([]byte(Hello), 0, 0, 0, 3), "{{{"...)},
		{"silent", nil},
		{"old version", frameOf(t, Report{Version: Version + 1})},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(c.send)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || !strings.HasPrefix(line, "ERROR ") {
			t.Errorf("%s: got %q %v, want an ERROR line", c.name, line, err)
		}
	}
	s, got, err := Dial(context.Background(), addr, 5*time.Second, 2*time.Second, theirs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.Close()
	if got.Node != "a1" || r.r.Node != "a2" {
		t.Errorf("the peer got %q, the listener %q", got.Node, r.r.Node)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(log.String(), "doctor: ignored connection from"); n != 6 {
		t.Errorf("%d ignored connections logged, want 6:\n%s", n, log.String())
	}
}

func frameOf(t *testing.T, r Report) []byte {
	var b bytes.Buffer
	b.WriteString(Hello)
	c1, c2 := net.Pipe()
	s := &Session{conn: c1, r: bufio.NewReader(c1), timeout: time.Second}
	go func() { s.write(r, time.Second); c1.Close() }()
	io.Copy(&b, c2)
	return b.Bytes()
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestDialGivesUp(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	if _, _, err := Dial(context.Background(), addr, 500*time.Millisecond, 200*time.Millisecond, Report{Version: Version}); err == nil {
		t.Fatal("Dial to nobody succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Dial took %v to give up after a 0.5 s wait", d)
	}
}

// A listener that answers with ERROR makes Dial fail with its reason.
func TestDialRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ListenOn(context.Background(), ln, 5*time.Second, time.Second, Report{Version: Version}, io.Discard)
	_, _, err = Dial(context.Background(), ln.Addr().String(), 2*time.Second, time.Second, Report{Version: 99})
	if err == nil || !strings.Contains(err.Error(), "the listener refused us: report version 99") {
		t.Errorf("Dial with a wrong version: %v", err)
	}
}

func TestListenWaitEnds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = ListenOn(context.Background(), ln, 300*time.Millisecond, time.Second, Report{Version: Version}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "no doctor peer connected") {
		t.Errorf("ListenOn with nobody: %v", err)
	}
}
