package doctor

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// The two-node exchange. The peer (--peer) connects to the listener (--listen) and sends
// the hello line, then its report; the listener answers with the hello line and its report,
// or with "ERROR reason\n" and closes. Each report is a frame: a 4-byte big-endian length,
// then that many bytes of JSON, at most MaxFrame. Every read and write has a deadline, so a
// stray client (a port scanner, a wrong program) gets an error instead of a hang, and the
// listener goes back to waiting for a real peer. The traffic tests then run in steps the
// listener leads (steps.go).

// Hello opens both directions of the exchange; a new wire format gets a new version.
const Hello = "MPIB-DOCTOR/1\n"

// MaxFrame bounds one frame: a report of 16 devices with 8 SUP ports each and a routing
// table of a few hundred entries is far below it.
const MaxFrame = 1 << 20

// ErrNotDoctor is what a connection that does not speak the exchange gets.
var ErrNotDoctor = errors.New("not an mpib-agent doctor peer")

// Session is an established exchange.
type Session struct {
	conn    net.Conn
	r       *bufio.Reader
	timeout time.Duration
}

// Close ends the session.
func (s *Session) Close() error { return s.conn.Close() }

func (s *Session) write(v any, timeout time.Duration) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("frame of %d bytes: at most %d", len(b), MaxFrame)
	}
	s.conn.SetWriteDeadline(time.Now().Add(timeout))
	buf := binary.BigEndian.AppendUint32(nil, uint32(len(b)))
	_, err = s.conn.Write(append(buf, b...))
	return err
}

func (s *Session) read(v any, timeout time.Duration) error {
	s.conn.SetReadDeadline(time.Now().Add(timeout))
	var hdr [4]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		return fmt.Errorf("reading a frame: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return fmt.Errorf("%w: frame of %d bytes (at most %d)", ErrNotDoctor, n, MaxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(s.r, b); err != nil {
		return fmt.Errorf("reading a frame of %d bytes: %w", n, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%w: %v", ErrNotDoctor, err)
	}
	return nil
}

// readHello reads the hello line, or the listener's ERROR line, within the deadline.
func (s *Session) readHello(timeout time.Duration) error {
	s.conn.SetReadDeadline(time.Now().Add(timeout))
	line, err := s.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return fmt.Errorf("%w: no hello line", ErrNotDoctor)
		}
		return fmt.Errorf("reading the hello: %w", err)
	}
	if msg, ok := strings.CutPrefix(string(line), "ERROR "); ok {
		return fmt.Errorf("the listener refused us: %s", strings.TrimSpace(msg))
	}
	if string(line) != Hello {
		return fmt.Errorf("%w: hello %q, want %q", ErrNotDoctor, strings.TrimSpace(string(line)), strings.TrimSpace(Hello))
	}
	return nil
}

func checkReport(r Report) error {
	if r.Version != Version {
		return fmt.Errorf("report version %d, this doctor speaks %d: run one release on both nodes", r.Version, Version)
	}
	return nil
}

// Listen waits on addr until a doctor peer has exchanged reports with it, or wait passes.
// A connection that fails the exchange is told why, closed and logged; waiting goes on.
func Listen(ctx context.Context, addr string, wait, timeout time.Duration, mine Report, log io.Writer) (*Session, Report, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, Report{}, err
	}
	return ListenOn(ctx, ln, wait, timeout, mine, log)
}

// ListenOn is Listen on a listener of the caller's; it closes it.
func ListenOn(ctx context.Context, ln net.Listener, wait, timeout time.Duration, mine Report, log io.Writer) (*Session, Report, error) {
	defer ln.Close()
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, Report{}, fmt.Errorf("no doctor peer connected to %s within %v", addr, wait)
			}
			return nil, Report{}, err
		}
		s := &Session{conn: conn, r: bufio.NewReaderSize(conn, 256), timeout: timeout}
		theirs, err := s.accept(mine)
		if err == nil {
			return s, theirs, nil
		}
		fmt.Fprintf(log, "doctor: ignored connection from %v: %v\n", conn.RemoteAddr(), err)
		conn.Close()
	}
}

// accept runs the listener's half of the exchange on one connection.
func (s *Session) accept(mine Report) (Report, error) {
	var theirs Report
	err := s.readHello(s.timeout)
	if err == nil {
		err = s.read(&theirs, s.timeout)
	}
	if err == nil {
		err = checkReport(theirs)
	}
	if err != nil {
		s.refuse(err)
		return Report{}, err
	}
	s.conn.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := io.WriteString(s.conn, Hello); err != nil {
		return Report{}, err
	}
	return theirs, s.write(mine, s.timeout)
}

// refuse tells the client why and closes gently: what it sent beyond what we read is drained
// for a moment first, since closing with unread bytes would reset the connection and could
// discard the ERROR line before the client reads it.
func (s *Session) refuse(err error) {
	s.conn.SetWriteDeadline(time.Now().Add(s.timeout))
	io.WriteString(s.conn, "ERROR "+strings.ReplaceAll(err.Error(), "\n", " ")+"\n")
	if tc, ok := s.conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	s.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	io.Copy(io.Discard, io.LimitReader(s.conn, 1<<20))
}

// Dial connects to a listener at addr, retrying until wait passes (the other node may start
// later), and exchanges reports.
func Dial(ctx context.Context, addr string, wait, timeout time.Duration, mine Report) (*Session, Report, error) {
	deadline := time.Now().Add(wait)
	var conn net.Conn
	var err error
	for {
		d := net.Dialer{Timeout: timeout}
		if conn, err = d.DialContext(ctx, "tcp", addr); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, Report{}, fmt.Errorf("connecting to the doctor at %s for %v: %w", addr, wait, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	s := &Session{conn: conn, r: bufio.NewReaderSize(conn, 256), timeout: timeout}
	theirs, err := s.connect(mine)
	if err != nil {
		conn.Close()
		return nil, Report{}, fmt.Errorf("exchange with %s: %w", addr, err)
	}
	return s, theirs, nil
}

// connect runs the peer's half of the exchange.
func (s *Session) connect(mine Report) (Report, error) {
	s.conn.SetWriteDeadline(time.Now().Add(s.timeout))
	if _, err := io.WriteString(s.conn, Hello); err != nil {
		return Report{}, err
	}
	if err := s.write(mine, s.timeout); err != nil {
		return Report{}, err
	}
	if err := s.readHello(s.timeout); err != nil {
		return Report{}, err
	}
	var theirs Report
	if err := s.read(&theirs, s.timeout); err != nil {
		return Report{}, err
	}
	return theirs, checkReport(theirs)
}
