"""Traces: telemetry records with their ground truth, and capacity traces the simulator
replays. The format (JSON Lines) is in docs/agent.md, "Traces"; in short, each line is one of

- a **header** (no ``"t"``): ``{"comment": "...", "msg_bytes": 524288, "noise": 0.03,
  "sout_latency_us": 5, "sup_latency_us": 5}``, every key optional (``noise`` at most
  :data:`mpib_agent.sim.NOISE_MAX`); a :class:`Recorder` writes the recorded model there;
- a **capacity point**: ``{"t": 16, "sout_mbps": 12.5, "sup_mbps": 6.25}`` (and optionally
  ``sout_state``/``sup_state``: up, down, failed): the rails from ``t`` on; a rail left out
  keeps its value; a line with ``t`` alone marks a time (the trace's end);
- a **telemetry record** (what ``record --raw`` writes): ``{"t": ..., "conns": [...]}``, each
  connection with the ``top --json`` fields, ``raw`` (every counter of the segment's
  telemetry) and, when a simulator drives the segment, ``truth`` (its rails' capacities and
  states, the best split and its throughput).

``t`` is seconds from any origin (record writes unix time); a trace starts at its first ``t``
and ends at its last. A replay takes the capacity points when the trace has any, else the
``truth`` of the first send connection that has one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Dict, List, Optional, Tuple

from ._layout import RAIL_STATES
from ._policy import Policy
from ._segment import create
from ._types import SegmentError, Slot
from ._watch import raw_sample
from .sim import NOISE_MAX, Conn, Event, Rail, Scenario, Simulator, drive

HEADER_KEYS = ("comment", "msg_bytes", "noise", "sout_latency_us", "sup_latency_us")
POINT_KEYS = ("sout_mbps", "sup_mbps", "sout_state", "sup_state")
DEFAULT_MSG_BYTES = 512 << 10  # the lab's transfers (mpib-nettest --max-size 512K)


class Recorder:
    """Writes a trace of a simulator on the virtual clock: pass it as ``on_interval`` to
    :func:`mpib_agent.sim.drive`. Each record's ``t`` is simulated seconds. The header holds
    the scenario's noise and the message size and latencies of the connection a replay
    follows (the send connection of the lowest slot, whose truth comes first in each record),
    so that the trace replays with the model it was recorded with."""

    def __init__(self, out: IO[str], sim: Simulator, comment: str = "") -> None:
        self.out, self.sim = out, sim
        self._seg = sim.procs[next(iter(sim.procs))].seg if sim.procs else None
        self.prev: Dict[int, Slot] = {s.index: s for s in self._seg.connections()} if self._seg else {}
        self.prev_t = sim.t
        head: Dict[str, Any] = {"comment": comment or f"simulated: scenario {sim.scenario.name}"}
        first = min((c for c in sim.conns if c.spec.is_send), key=lambda c: c.slot, default=None)
        if first is not None:
            head.update(
                msg_bytes=first.spec.msg_bytes,
                sout_latency_us=first.sout.latency_us,
                sup_latency_us=first.sup.latency_us,
            )
        head["noise"] = sim.scenario.noise
        out.write(json.dumps(head) + "\n")

    def __call__(self, sim: Simulator) -> None:
        if self._seg is None:
            return
        cur = {s.index: s for s in self._seg.connections()}
        truth = {(c["slot"], c["gen"]): c for c in sim.truth()}
        rec = raw_sample(self.prev, cur, sim.t - self.prev_t, truth, t=round(sim.t, 6))
        self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.prev, self.prev_t = cur, sim.t


@dataclass
class Point:
    """The rails from ``t`` on (seconds from the trace's start; None: unchanged)."""

    t: float
    sout_mbps: Optional[float] = None
    sup_mbps: Optional[float] = None
    sout_state: Optional[str] = None
    sup_state: Optional[str] = None


@dataclass
class Trace:
    path: str
    header: Dict[str, Any] = field(default_factory=dict)
    points: List[Point] = field(default_factory=list)
    records: List[Dict[str, Any]] = field(default_factory=list)  # telemetry records, t from the start
    duration: float = 0.0


def _bad(path: str, line: int, msg: str) -> SegmentError:
    return SegmentError("bad_trace", f"{path}:{line}: {msg}")


def _rate(path: str, n: int, obj: Dict[str, Any], key: str, where: str = "") -> Optional[float]:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _bad(path, n, f"{where}{key}: want Mbit/s >= 0, got {json.dumps(v)}")
    return float(v)


def _point(path: str, n: int, obj: Dict[str, Any], t: float, where: str = "") -> Point:
    """The rails in ``obj`` (a capacity point, or a record's truth: ``where`` names it in
    errors) from ``t`` on."""
    p = Point(t, _rate(path, n, obj, "sout_mbps", where), _rate(path, n, obj, "sup_mbps", where))
    for key in ("sout_state", "sup_state"):
        v = obj.get(key)
        if v is not None and v not in RAIL_STATES:
            raise _bad(path, n, f"{where}{key}: want one of {', '.join(RAIL_STATES)}, got {json.dumps(v)}")
        setattr(p, key, v)
    return p


def _truth_point(path: str, n: int, rec: Dict[str, Any], t: float) -> Optional[Point]:
    """The rails from the truth of the record's first send connection that has one (from
    ``t`` on). The record's shape is checked as far as a replay reads it: ``conns`` a list of
    objects, each ``truth`` an object with valid rates and states."""
    conns = rec["conns"]
    if not isinstance(conns, list) or not all(isinstance(c, dict) for c in conns):
        raise _bad(path, n, f"conns: want a list of objects (record --raw), got {json.dumps(conns)[:80]}")
    found: Optional[Point] = None
    for i, c in enumerate(conns):
        tr = c.get("truth")
        if tr is None:
            continue
        if not isinstance(tr, dict):
            raise _bad(path, n, f"conns[{i}].truth: want an object, got {json.dumps(tr)[:80]}")
        p = _point(path, n, tr, t, f"conns[{i}].truth.")
        if found is None and c.get("is_send") == 1:
            found = p
    return found


def read_trace(path: str) -> Trace:
    """Parses a trace file (SegmentError("bad_trace") naming the line of what is wrong)."""
    tr = Trace(path)
    t0: Optional[float] = None
    last = 0.0
    truth: List[Point] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise _bad(path, n, f"not JSON: {e}") from None
            if not isinstance(obj, dict):
                raise _bad(path, n, "want a JSON object")
            if "t" not in obj:
                unknown = sorted(set(obj) - set(HEADER_KEYS))
                if unknown:
                    raise _bad(path, n, f"a header line (no t) takes {', '.join(HEADER_KEYS)}; got {unknown[0]!r}")
                tr.header.update(obj)
                continue
            t = obj["t"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise _bad(path, n, f"t: want seconds, got {json.dumps(t)}")
            t0 = float(t) if t0 is None else t0
            if t - t0 < last - 1e-9:
                raise _bad(path, n, f"t {t} goes back (the trace's lines are in time order)")
            last = float(t) - t0
            if "conns" in obj:
                # a record's truth holds over the interval it ends: from the previous record on
                p = _truth_point(path, n, obj, tr.records[-1]["t"] if tr.records else last)
                tr.records.append(dict(obj, t=last))
                if p is not None:
                    truth.append(p)
            elif set(obj) & set(POINT_KEYS):
                unknown = sorted(set(obj) - set(POINT_KEYS) - {"t", "comment"})
                if unknown:
                    raise _bad(path, n, f"a capacity point takes t, {', '.join(POINT_KEYS)}; got {unknown[0]!r}")
                tr.points.append(_point(path, n, obj, last))
            # else: only a time (the trace's end, say)
    tr.duration = last
    if not tr.points:
        tr.points = truth
    return tr


def _header_num(tr: Trace, key: str, default: float, most: float = math.inf) -> float:
    v = tr.header.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v > most:
        want = "a number >= 0" if most == math.inf else f"a number from 0 to {most:g}"
        raise SegmentError("bad_trace", f"{tr.path}: header {key}: want {want}, got {json.dumps(v)}")
    return float(v)


def trace_scenario(tr: Trace) -> Scenario:
    """The scenario that replays ``tr``: one send connection (intra-island) whose rails take
    the trace's capacities and states at their times, for the trace's duration."""
    if not tr.points:
        raise SegmentError(
            "bad_trace",
            f"{tr.path}: no capacities: want capacity points "
            '({"t": 0, "sout_mbps": 12.5, "sup_mbps": 25}) or records with truth',
        )
    first = tr.points[0]
    if first.sout_mbps is None or first.sup_mbps is None:
        raise SegmentError("bad_trace", f"{tr.path}: the first capacity point must give sout_mbps and sup_mbps")
    if tr.duration <= 0:
        raise SegmentError("bad_trace", f"{tr.path}: the trace lasts 0 s: end it with a line at its last t")
    msg = int(_header_num(tr, "msg_bytes", DEFAULT_MSG_BYTES))
    if msg <= 0:
        raise SegmentError("bad_trace", f"{tr.path}: header msg_bytes: want bytes > 0")
    rails = (
        Rail(first.sout_mbps, _header_num(tr, "sout_latency_us", 5.0)),
        Rail(first.sup_mbps, _header_num(tr, "sup_latency_us", 5.0)),
    )
    events: List[Event] = []
    states = (first.sout_state or "up", first.sup_state or "up")
    for r, st in zip(("sout", "sup"), states):
        if st != "up":
            events.append(Event(0.0, r, state=st))
    rates: Tuple[float, float] = (first.sout_mbps, first.sup_mbps)
    for p in tr.points[1:]:
        new_rates = (
            p.sout_mbps if p.sout_mbps is not None else rates[0],
            p.sup_mbps if p.sup_mbps is not None else rates[1],
        )
        new_states = (p.sout_state or states[0], p.sup_state or states[1])
        for k, r in enumerate(("sout", "sup")):
            mbps = new_rates[k] if new_rates[k] != rates[k] else None
            state = new_states[k] if new_states[k] != states[k] else None
            if (mbps is not None or state is not None) and p.t < tr.duration:
                events.append(Event(p.t, r, mbps=mbps, state=state))
        rates, states = new_rates, new_states
    name = os.path.basename(tr.path)
    desc = str(tr.header.get("comment", f"replay of {tr.path}"))
    return Scenario(
        name,
        desc,
        (Conn(rails[0], rails[1], msg_bytes=msg),),
        tuple(events),
        duration=tr.duration,
        noise=_header_num(tr, "noise", 0.03, NOISE_MAX),
    )


def percent_of_optimum(sim: Simulator) -> float:
    """The send connections' bytes over what the best split would have moved, in percent
    (receive connections read no hints, so they are left out)."""
    sends = [c for c in sim.conns if c.spec.is_send]
    best = sum(c.optimal for c in sends)
    return 100.0 * sum(c.delivered for c in sends) / best if best > 0 else 0.0


def simulate(
    scenario: Scenario, policy: Policy, seed: int, interval: float = 0.5, record: Optional[IO[str]] = None
) -> float:
    """Runs ``policy`` over the whole of ``scenario`` on the virtual clock, on a segment of
    its own (removed after), and returns the percent of the optimum; with ``record``, writes
    the run's trace there (a :class:`Recorder`)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="mpib-eval-", dir=base)
    try:
        # few slots: every interval the agent reads them all
        create(os.path.join(d, "hints"), max(16, 4 * len(scenario.conns)), 16).close()
        with Simulator(scenario, os.path.join(d, "hints"), seed=seed) as s:
            rec = Recorder(record, s) if record is not None else None
            drive(s, policy, interval=interval, duration=scenario.duration, on_interval=rec)
            return percent_of_optimum(s)
    finally:
        shutil.rmtree(d, ignore_errors=True)


__all__ = ["Point", "Recorder", "Trace", "percent_of_optimum", "raw_sample", "read_trace", "simulate", "trace_scenario"]
