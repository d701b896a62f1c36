// phases.go: where one handshake's time went (connPhases), for the INFO line every comm ends
// its setup with (handshake.go). The steps take monotonic timestamps (time.Now carries the
// monotonic clock) once per step of a connection, never per message. mpib-nettest's connect
// mode reads these lines through NCCL's logger and prints their means as `connect-phases:`
// (docs/nettest.md), so no symbol is added to what the library exports.

package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// connPhases is one handshake's steps. The sequential steps (params, qp_create, metadata,
// rtr_rts, ack, agent) each end at a mark and start where the previous one ended; the
// connector's dial and hello run beside params and qp_create (dial.go), and metadata starts
// when both are done. verbsWait is the time spent waiting for a verbs slot (threads.go) before
// qp_create and rtr_rts, or for the listener's spare receiver still being built (prepare.go).
// total runs from start to the end of the last step.
type connPhases struct {
	start time.Time // connector: its handshake's start; acceptor: the TCP accept
	last  time.Time // where the next sequential step starts

	params    time.Duration // classification, SUP plan, GID choice (connParams)
	dial      time.Duration // connector: the TCP connect of the control connection
	hello     time.Duration // connector: writing the hello; acceptor: accept to the hello read
	qpCreate  time.Duration // CQs, SRQ, the CTS area's MRs, QPs to INIT (mpib_comm_create, or a spare's completion)
	verbsWait time.Duration // waiting for a verbs slot (qp_create, rtr_rts) or the listener's spare
	metadata  time.Duration // the metadata exchange, including the wait for the peer's
	rtrRts    time.Duration // every QP to RTR and RTS (mpib_comm_connect)
	ack       time.Duration // the ready exchange
	agent     time.Duration // the agent segment's registration (advanced mode)
	total     time.Duration
}

// newPhases starts a handshake's phases at t.
func newPhases(t time.Time) connPhases { return connPhases{start: t, last: t} }

// mark ends the sequential step d now.
func (ph *connPhases) mark(d *time.Duration) {
	now := time.Now()
	*d += now.Sub(ph.last)
	ph.last = now
}

// joinAt makes the next sequential step start at t when t is later than where it would (the
// connector's metadata waits for its dial and hello too).
func (ph *connPhases) joinAt(t time.Time) {
	if ph.last.Before(t) {
		ph.last = t
	}
}

// finish sets total at the end of the last step.
func (ph *connPhases) finish() { ph.total = ph.last.Sub(ph.start) }

// inSlot runs fn in a verbs slot (withVerbsSlot) as the sequential step d: the wait for the
// slot goes to verbsWait, the rest of the step (up to fn's return) to d.
func inSlot[T any](ctx context.Context, ph *connPhases, d *time.Duration, fn func() T) (T, error) {
	var waited time.Duration
	v, err := withVerbsSlotWait(ctx, &waited, fn)
	ph.verbsWait += waited
	ph.last = ph.last.Add(waited)
	ph.mark(d)
	return v, err
}

// String is the INFO line's tail: "setup ms: key=value ...". The keys are the ones
// mpib-nettest's connect-phases line takes (with _ms); dial is the connector's only.
func (ph *connPhases) String() string {
	return "setup ms: " + formatPhases(ph.fields())
}

// phaseField is one key of the INFO line and its value in milliseconds.
type phaseField struct {
	key string
	ms  float64
}

func (ph *connPhases) fields() []phaseField {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	f := []phaseField{{"params", ms(ph.params)}}
	if ph.dial > 0 {
		f = append(f, phaseField{"dial", ms(ph.dial)})
	}
	f = append(f, phaseField{"hello", ms(ph.hello)}, phaseField{"qp_create", ms(ph.qpCreate)},
		phaseField{"verbs_wait", ms(ph.verbsWait)}, phaseField{"metadata", ms(ph.metadata)},
		phaseField{"rtr_rts", ms(ph.rtrRts)}, phaseField{"ack", ms(ph.ack)}, phaseField{"agent", ms(ph.agent)},
		phaseField{"total", ms(ph.total)})
	return f
}

// formatPhases writes fields as "k=v k=v" with one decimal.
func formatPhases(fields []phaseField) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%.1f", f.key, f.ms)
	}
	return b.String()
}
