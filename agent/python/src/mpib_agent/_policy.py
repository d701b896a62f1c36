"""Telemetry rates, the built-in policies and the agent loop (heartbeat + policy ticks).

The rules are the Go agent's (agent/go/policy, agent/go/cmd/mpib-agent); the Go CLI test
TestCLIsAgree runs both agents on one segment.
"""

from __future__ import annotations

import _thread
import json
import os
import re
import signal
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ._layout import SUP_BW_MAX
from ._resolve import clamp, prefix_mask
from ._segment import Segment, beat_period_s, now_ns, parse_class
from ._types import SegmentError, Slot, integer, ip_int, ip_str


@dataclass(frozen=True)
class ConnRate:
    """One connection's per-rail throughput between two samples."""

    slot: Slot
    sout_bps: float
    sup_bps: float
    sout_req_per_s: float
    sup_req_per_s: float
    # from the completion telemetry: bytes per second whose completion the
    # sender saw, and the mean completion latency of the requests completed in the interval
    # (0 when none completed)
    sout_completed_bps: float = 0.0
    sup_completed_bps: float = 0.0
    sout_latency_ns: float = 0.0
    sup_latency_ns: float = 0.0
    # bytes completed per second of the rail's active time (a request in flight on it; 0 when
    # it completed nothing): what the rail delivers while it has work
    sout_active_bps: float = 0.0
    sup_active_bps: float = 0.0

    @property
    def sup_share(self) -> float:
        t = self.sout_bps + self.sup_bps
        return self.sup_bps / t if t > 0 else 0.0


def replacement_watch(seg: Segment) -> Callable[[], bool]:
    """A function that reports whether seg moved to another file (``reattach``) since its
    previous call."""
    seen = seg.attachment

    def replaced() -> bool:
        nonlocal seen
        moved, seen = seg.attachment != seen, seg.attachment
        return moved

    return replaced


def rate_sampler(seg: Segment) -> Callable[[], Tuple[Dict[int, Slot], List[ConnRate]]]:
    """A function that samples seg's connections and returns them (by slot) with each one's
    rates since the previous call (the first call: since rate_sampler was called). After
    seg moved to another file it returns no rates once: counters of two files do not pair."""
    prev: Dict[int, Slot] = {s.index: s for s in seg.connections()}
    prev_t = now_ns()
    replaced = replacement_watch(seg)

    def next_sample() -> Tuple[Dict[int, Slot], List[ConnRate]]:
        nonlocal prev, prev_t
        if replaced():
            prev = {}
        cur_t = now_ns()
        cur = {s.index: s for s in seg.connections()}
        rs = rates(prev, cur, (cur_t - prev_t) / 1e9)
        prev, prev_t = cur, cur_t
        return cur, rs

    return next_sample


def rates(prev: Mapping[int, Slot], cur: Mapping[int, Slot], dt_s: float) -> List[ConnRate]:
    """Rates of slots present in both samples with the same gen (indexed by slot)."""
    out: List[ConnRate] = []
    if dt_s <= 0:
        return out
    for i in sorted(cur):
        c, p = cur[i], prev.get(i)
        if p is None or p.gen != c.gen:
            continue
        ct, pt = c.telemetry, p.telemetry

        def d(a: int, b: int) -> float:
            return max(b - a, 0) / dt_s

        out.append(
            ConnRate(
                c,
                d(pt.sout_bytes, ct.sout_bytes),
                d(pt.sup_bytes, ct.sup_bytes),
                d(pt.sout_requests, ct.sout_requests),
                d(pt.sup_requests, ct.sup_requests),
                d(pt.sout_completed_bytes, ct.sout_completed_bytes),
                d(pt.sup_completed_bytes, ct.sup_completed_bytes),
                mean_latency(pt.sout_busy_ns, ct.sout_busy_ns, pt.sout_completed_requests, ct.sout_completed_requests),
                mean_latency(pt.sup_busy_ns, ct.sup_busy_ns, pt.sup_completed_requests, ct.sup_completed_requests),
                active_rate(pt.sout_completed_bytes, ct.sout_completed_bytes, pt.sout_active_ns, ct.sout_active_ns),
                active_rate(pt.sup_completed_bytes, ct.sup_completed_bytes, pt.sup_active_ns, ct.sup_active_ns),
            )
        )
    return out


def mean_latency(busy0: int, busy1: int, req0: int, req1: int) -> float:
    """Mean completion latency (ns) of the requests completed between two samples: the busy
    time they added over their number (0 when none completed)."""
    if req1 <= req0 or busy1 < busy0:
        return 0.0
    return (busy1 - busy0) / (req1 - req0)


def active_rate(bytes0: int, bytes1: int, active0: int, active1: int) -> float:
    """Bytes completed between two samples per second of the rail's active time in between
    (0 when nothing completed or no active time was recorded)."""
    if bytes1 <= bytes0 or active1 <= active0:
        return 0.0
    return (bytes1 - bytes0) / ((active1 - active0) / 1e9)


@dataclass
class Proportional:
    """sup_bw = 1024 * C_sup / (C_sout + C_sup), C configured or the decaying peak of the
    node's measured per-rail throughput (kept within [min_sup_bw, max_sup_bw] while
    measuring). Same rule as the Go agent's ``--policy proportional``."""

    cap_sout: float = 0.0
    cap_sup: float = 0.0
    decay: float = 0.98
    min_sup_bw: int = 64
    max_sup_bw: int = 960
    peak_sout: float = 0.0
    peak_sup: float = 0.0

    def observe(self, rs: List[ConnRate]) -> None:
        d = self.decay if 0 < self.decay <= 1 else 0.98
        self.peak_sout = max(self.peak_sout * d, sum(r.sout_bps for r in rs))
        self.peak_sup = max(self.peak_sup * d, sum(r.sup_bps for r in rs))

    def sup_bw(self) -> int:
        if self.cap_sout > 0 or self.cap_sup > 0:
            return _share(self.cap_sout, self.cap_sup)
        if self.peak_sout + self.peak_sup <= 0:
            return 512
        return min(max(_share(self.peak_sout, self.peak_sup), self.min_sup_bw), self.max_sup_bw)


def _share(sout: float, sup: float) -> int:
    sout, sup = max(sout, 0.0), max(sup, 0.0)
    if sout + sup == 0:
        return 512
    x = SUP_BW_MAX * sup / (sout + sup)
    return int(x + 0.5)  # half away from zero, as Go's math.Round (Python's round() is half-even)


class SlotSkippedWarning(UserWarning):
    """A hint was not written because its connection closed (or its slot now holds another
    registration) while the policy ran; the loop goes on."""


def gone(e: SegmentError) -> bool:
    """A slot write refused because the connection closed, the slot now holds another
    registration, or the slot lies beyond a smaller segment that replaced the one the
    connection was read from."""
    return e.code in ("slot_inactive", "gen_changed", "slot_range")


# ---- the agent loop -----------------------------------------------------------------------


class _Beater(threading.Thread):
    """Beats every ``period`` seconds from its own thread (a slow policy never lets the
    heartbeat go stale) and, every 250 ms, follows a replaced or truncated segment. It moves
    only while it holds ``ticking``, so that no tick runs across the move, and never waits
    for it: while a tick runs it looks again at the next beat."""

    def __init__(self, seg: Segment, period: float, note: Callable[[str], None], ticking: threading.Lock) -> None:
        super().__init__(name="mpib-agent-beat", daemon=True)
        self.seg, self.period, self.note, self.ticking = seg, period, note, ticking
        self.halt = threading.Event()

    def run(self) -> None:
        last_check, last_warn = 0.0, ""
        while not self.halt.wait(self.period):
            try:
                self.seg.beat()
            except (SegmentError, OSError):
                pass
            if time.monotonic() - last_check < 0.25 or not self.ticking.acquire(blocking=False):
                continue  # a tick runs: look at the next beat (never wait for it: beats go on)
            last_check = time.monotonic()
            try:
                try:
                    moved = self.seg.reattach()
                finally:
                    self.ticking.release()
                if moved:
                    self.seg.beat()
                    self.note(f"segment {self.seg.path} replaced: re-attached")
                    last_warn = ""
                elif self.seg.err() is not None and last_warn != "gone":
                    last_warn = "gone"
                    warnings.warn(f"{self.seg.err()}: waiting for a new segment at the path", stacklevel=1)
            except (SegmentError, OSError) as e:
                if str(e) != last_warn:
                    last_warn = str(e)
                    warnings.warn(
                        f"segment {self.seg.path} replaced or truncated, the new one is unusable: {e}", stacklevel=1
                    )


def agent_loop(
    seg: Segment,
    tick: Callable[[], None],
    interval: float,
    *,
    duration: Optional[float] = None,
    stop: Optional[threading.Event] = None,
    beat_every: Optional[float] = None,
    immediate: bool = True,
    note: Callable[[str], None] = lambda s: print(s, flush=True),
) -> None:
    """The one beating agent of ``seg`` (spec 5.2, 5.7): takes the agent lock
    (SegmentError("agent_running") when another agent, Go or Python, holds it), beats every
    ``beat_every`` s (default MPIB_AGENT_STALE_MS/4) from its own thread, and calls ``tick``
    every ``interval`` s (first at once when ``immediate``) until ``duration`` elapses,
    ``stop`` is set, or KeyboardInterrupt. A tick never overlaps a re-attachment: what it reads
    and what it writes belong to one segment, and a tick that finds ``seg.attachment`` changed
    knows its policy's memory of what it wrote is void. On the way out it clears the heartbeat
    only if it is still its own, and drops the agent lock."""
    stop = stop or threading.Event()
    seg.acquire_agent()
    ticking = threading.Lock()  # held by a tick, and by the beater while it re-attaches
    beater = _Beater(seg, beat_every if beat_every is not None else beat_period_s(), note, ticking)
    try:
        seg.beat()
        beater.start()
        t0 = time.monotonic()
        next_tick = t0 if immediate else t0 + interval
        while not stop.is_set():
            now = time.monotonic()
            if duration is not None and now - t0 >= duration:
                break
            if now >= next_tick:
                with ticking:
                    if seg.err() is None:
                        try:
                            tick()
                        except SegmentError as e:
                            if e.code != "segment_gone":
                                raise
                next_tick += interval
                if next_tick < time.monotonic():
                    next_tick = time.monotonic() + interval
            wait = next_tick - time.monotonic()
            if duration is not None:
                wait = min(wait, t0 + duration - time.monotonic())
            stop.wait(max(wait, 0.0))
    except KeyboardInterrupt:
        pass
    finally:
        beater.halt.set()
        if beater.is_alive():
            beater.join()
        seg.stop_beat()
        seg.release_agent()


Policy = Callable[[List[ConnRate]], Optional[Dict[int, int]]]


def hint_items(hints: Optional[Mapping[int, int]]) -> List[Tuple[int, int]]:
    """A policy callback's {slot: sup_bw} as (slot, sup_bw) pairs, each slot an int (a numpy
    integer is one; the sup_bw is checked where it is written). SegmentError("bad_value")
    names a slot key that is no integer."""
    out = []
    for slot, bw in (hints or {}).items():
        n = integer(slot)
        if n is None:
            raise SegmentError("bad_value", f"policy returned slot {slot!r}: want an integer slot index")
        out.append((n, bw))
    return out


def run_policy(
    seg: Segment,
    callback: Policy,
    interval: float = 1.0,
    *,
    duration: Optional[float] = None,
    stop: Optional[threading.Event] = None,
    beat_every: Optional[float] = None,
) -> None:
    """Runs ``callback`` as the segment's policy. Every ``interval`` s it is called with the
    per-connection rates of the last interval and returns {slot: sup_bw} to write (or None).
    Each hint is written for the registration (gen) the rates were computed on; a connection
    that closed meanwhile is skipped with a SlotSkippedWarning. The heartbeat is beaten every
    ``beat_every`` s (default MPIB_AGENT_STALE_MS/4) from its own thread, so a slow callback
    never makes plugins fall back. When the segment is replaced (re-created at its path), a
    callback with a ``segment_replaced()`` method (:class:`ClosedLoopPolicy` has one) is told
    before its next call, so that it returns every hint again: the new segment holds none.
    Runs until ``duration`` elapses, ``stop`` is set, or KeyboardInterrupt; then clears its own
    heartbeat (plugins fall back to vanilla at once). Raises SegmentError("agent_running") when
    another agent beats the segment."""
    next_sample = rate_sampler(seg)
    replaced = replacement_watch(seg)
    forget = getattr(callback, "segment_replaced", None)

    def tick() -> None:
        if replaced() and forget is not None:
            forget()
        cur, rs = next_sample()
        for slot, bw in hint_items(callback(rs)):
            c = cur.get(slot)
            if c is None:
                warnings.warn(SlotSkippedWarning(f"slot {slot}: no active connection in this sample"), stacklevel=2)
                continue
            try:
                seg.set_slot_hint(slot, bw, gen=c.gen)
            except SegmentError as e:
                if not gone(e):
                    raise
                warnings.warn(SlotSkippedWarning(str(e)), stacklevel=2)

    agent_loop(
        seg, tick, interval, duration=duration, stop=stop, beat_every=beat_every, immediate=False, note=lambda s: None
    )


def signal_setter(stop: threading.Event) -> Callable[[int, object], None]:
    """A signal handler that sets ``stop`` from a new low-level thread, never from the handler.

    A handler runs in the main thread between two bytecodes, possibly while that thread is inside
    ``stop.wait()`` holding the event's internal lock (a plain, non-reentrant Lock): calling
    ``stop.set()`` there waits for that lock forever (both threads then sit in futex waits).
    ``_thread.start_new_thread`` takes no
    Python-level lock, and its thread sets the event once the main thread lets go of it."""

    def handler(signum: int, frame: object) -> None:
        _thread.start_new_thread(stop.set, ())

    return handler


def install_sigterm_stop(stop: threading.Event) -> None:
    """Makes SIGTERM set ``stop`` (for daemons)."""
    signal.signal(signal.SIGTERM, signal_setter(stop))


# ---- the static policy ----------------------------------------------------------------------

_PEER_RE = re.compile(r"^([0-9]{1,3}(?:\.[0-9]{1,3}){3})(?:/([0-9]{1,2}))?$")
_CONN_RE = re.compile(r"^([0-9]+)(?::([0-9]+))?$")


def parse_peer(s: str) -> Tuple[str, int]:
    """IP or IP/LEN (LEN 0..32, default 32) -> (ip, len); SegmentError bad_value/bad_prefix.
    The ip comes back masked to LEN, the key a peer entry stores (spec 5.6): "10.0.2.7/24" is
    ("10.0.2.0", 24)."""
    m = _PEER_RE.match(s)
    if m is None or not s.isascii():
        raise SegmentError("bad_value", f"want IP or IP/LEN, got {s!r}")
    try:
        ip = ip_int(m.group(1))
    except ValueError:
        raise SegmentError("bad_value", f"{m.group(1)!r} is not an IPv4 address") from None
    plen = int(m.group(2)) if m.group(2) is not None else 32
    if plen > 32:
        raise SegmentError("bad_prefix", "prefix length must be 0..32")
    return ip_str(ip & prefix_mask(plen)), plen


@dataclass(frozen=True)
class ConnSelector:
    """A connection by slot index (pid is None) or by PID:CONN_ID."""

    slot: int = 0
    pid: Optional[int] = None
    conn_id: int = 0

    def find(self, conns: List[Slot]) -> Optional[Slot]:
        for c in conns:
            if (self.pid is None and c.index == self.slot) or (
                self.pid is not None and c.pid == self.pid and c.conn_id == self.conn_id
            ):
                return c
        return None


def parse_conn(s: str) -> ConnSelector:
    """SLOT or PID:CONN_ID (decimal digits only)."""
    m = _CONN_RE.match(s)
    if m is None or not s.isascii():
        raise SegmentError("bad_value", f"want SLOT or PID:CONN_ID, got {s!r}")
    if m.group(2) is not None:
        pid, conn = int(m.group(1)), int(m.group(2))
        if pid >= 1 << 32 or conn >= 1 << 64:
            raise SegmentError("bad_value", f"want SLOT or PID:CONN_ID, got {s!r}")
        return ConnSelector(pid=pid, conn_id=conn)
    if int(m.group(1)) >= 1 << 32:
        raise SegmentError("bad_value", f"want SLOT or PID:CONN_ID, got {s!r}")
    return ConnSelector(slot=int(m.group(1)))


class _NotInt:
    def __init__(self, s: str) -> None:
        self.s = s

    def __repr__(self) -> str:
        return self.s


def _bad_constant(s: str) -> None:
    raise ValueError(f"{s} is not JSON")


_JSON_UINT = re.compile(r"^(0|[1-9][0-9]*)$")


def _parse_int(s: str) -> object:
    """json's parse_int: the Go agent's literal rule (digits, no sign: -0 and -1 are refused
    as written); a literal of more than 20 digits is taken as 2**64, which clamps as Go's
    overflow does (int() refuses very long literals)."""
    if not _JSON_UINT.match(s):
        return _NotInt(s)
    return int(s) if len(s) <= 20 else 1 << 64


@dataclass
class Weights:
    """The static policy file: {"class": {...}, "peers": {...}, "conns": {...}}, sup_bw
    values as JSON integers >= 0 (above 1024 written as 1024 with a warning)."""

    cls: Dict[str, int] = field(default_factory=dict)
    peers: Dict[str, int] = field(default_factory=dict)
    conns: Dict[str, int] = field(default_factory=dict)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: List[Tuple[str, object]]) -> Dict[str, object]:
    """json's object_pairs_hook: refuses a key given twice (json.loads keeps the last)."""
    out: Dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(f"duplicate key {_q(k)}")
        out[k] = v
    return out


def _q(s: str) -> str:
    """A key as the Go agent quotes it."""
    return json.dumps(s, ensure_ascii=False)


def _peer_target(k: str) -> Tuple[int, int]:
    ip, plen = parse_peer(k)
    return ip_int(ip), plen


def parse_weights(data: bytes) -> Weights:
    """Strict parse (same rules as the Go agent); SegmentError("bad_weights"). A key given
    twice in one object, or two keys of a section that name one target (class "0" and
    "intra"; peers "10.0.2.7" and "10.0.2.7/32"), is refused."""

    def bad(msg: str) -> SegmentError:
        return SegmentError("bad_weights", msg)

    try:
        top = json.loads(
            data.decode("utf-8"),
            parse_int=_parse_int,
            parse_float=_NotInt,
            parse_constant=_bad_constant,
            object_pairs_hook=_no_duplicates,
        )
    except _DuplicateKey as e:
        raise bad(str(e)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"not JSON: {e}") from None
    if not isinstance(top, dict):
        raise bad("want a JSON object with class, peers and conns")
    w = Weights()
    checks: Dict[str, Tuple[Dict[str, int], Callable[[str], object]]] = {
        "class": (w.cls, parse_class),
        "peers": (w.peers, _peer_target),
        "conns": (w.conns, parse_conn),
    }
    for name in sorted(top):
        if name not in checks:
            raise bad(f"unknown field {name!r} (class, peers, conns)")
        sec = top[name]
        if not isinstance(sec, dict):
            raise bad(f"{name}: want an object of KEY: sup_bw")
        dst, target = checks[name]
        _parse_section(name, sec, target, dst)
    return w


def _parse_section(name: str, sec: Dict[str, object], target: Callable[[str], object], dst: Dict[str, int]) -> None:
    """One section's keys (in sorted order, as the Go agent checks them) and values."""
    seen: Dict[object, str] = {}
    for k in sorted(sec):
        try:
            t = target(k)
        except SegmentError as e:
            raise SegmentError("bad_weights", f"{name} {k!r}: {e.detail}") from None
        if t in seen:
            raise SegmentError("bad_weights", f"{name} {_q(seen[t])} and {_q(k)} name the same target: keep one")
        seen[t] = k
        v = sec[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SegmentError("bad_weights", f"{name} {k!r}: sup_bw {v!r}: want an integer 0..1024")
        dst[k] = min(v, 0xFFFFFFFF)


class StaticWeights:
    """The static policy (Go: policy.Static): the weights file, re-read when it changes.

    - A file that cannot be read or parsed at the first tick raises SegmentError; later, the
      last good weights stay in force and the failure is reported once (a warning).
    - A key deleted from the file clears its hint: its connections return to the default.
    - conns entries are written for connections that register later too, and again when a
      slot key's slot is registered again.
    - After segment_replaced(), the next tick writes every default and conns entry again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.w: Optional[Weights] = None
        self.stamp = ""
        self.written: Dict[str, Tuple[int, int, int]] = {}
        self.missing: Dict[str, bool] = {}
        self.defaults_lost = False  # the segment was replaced since the class and peer defaults were written

    def _reload(self) -> Optional[Weights]:
        try:
            st = os.stat(self.path)
        except OSError as e:
            stamp = f"missing:{e}"
            if stamp == self.stamp:
                return None
            self.stamp = stamp
            raise SegmentError("bad_weights", str(e), self.path) from None
        stamp = f"{st.st_mtime_ns}/{st.st_size}"
        if stamp == self.stamp:
            return None
        self.stamp = stamp
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise SegmentError("bad_weights", str(e), self.path) from None
        try:
            return parse_weights(data)
        except SegmentError as e:
            raise SegmentError("bad_weights", e.detail, self.path) from None

    def segment_replaced(self) -> None:
        """Tells the policy that ``seg`` is now another segment (a re-created one:
        ``Segment.attachment`` changed). Nothing it wrote is there, and slot generations start
        again, so it forgets what it wrote: the next tick writes the class and peer defaults
        and every conns entry again."""
        self.written = {}
        self.defaults_lost = self.w is not None

    def tick(self, seg: Segment, conns: List[Slot]) -> List[str]:
        """Applies the weights; returns lines for the operator (warnings go to warnings)."""
        notes: List[str] = []
        try:
            nw = self._reload()
        except SegmentError as e:
            if self.w is None:
                raise
            warnings.warn(f"{e}: keeping the last good weights", stacklevel=2)
            nw = None
        if nw is not None:
            self._load(seg, nw, notes)
        elif self.defaults_lost:
            assert self.w is not None
            _write_defaults(seg, self.w)
        self.defaults_lost = False
        self._apply_conns(seg, conns, notes)
        return notes

    def _load(self, seg: Segment, nw: Weights, notes: List[str]) -> None:
        """Puts new weights in force: the hints of keys no longer in the file are cleared, the
        class and peer defaults written; conns entries are left to _apply_conns."""
        old = self.w or Weights()
        for k in sorted(old.cls):
            if k not in nw.cls:
                seg.set_class_hint(k, None)
                notes.append(f"policy: class {k} removed: cleared")
        for k in sorted(old.peers):
            if k not in nw.peers:
                ip, plen = parse_peer(k)
                seg.set_peer_hint(ip, None, prefix_len=plen)
                notes.append(f"policy: peer {k} removed: cleared")
        for k in sorted(self.written):
            if k not in nw.conns:
                slot, gen, _ = self.written[k]
                try:
                    seg.set_slot_hint(slot, None, gen=gen)
                except SegmentError as e:
                    if not gone(e):
                        raise
                notes.append(f"policy: conn {k} removed: slot {slot} cleared")
        _write_defaults(seg, nw)
        self.w, self.written, self.missing = nw, {}, {}
        notes.append(
            f"policy: static weights loaded: {len(nw.cls)} class, {len(nw.peers)} peer, {len(nw.conns)} conn entries"
        )

    def _apply_conns(self, seg: Segment, conns: List[Slot], notes: List[str]) -> None:
        """Writes the conns entries in force to the connections among conns that do not have
        them yet: new ones, and slots registered again since."""
        assert self.w is not None
        for k in sorted(self.w.conns):
            c = parse_conn(k).find(conns)
            if c is None:
                if not self.missing.get(k):
                    self.missing[k] = True
                    warnings.warn(f"conn {k}: no such connection yet (applied when it appears)", stacklevel=3)
                continue
            want = (c.index, c.gen, self.w.conns[k])
            if self.written.get(k) == want:
                continue
            try:
                seg.set_slot_hint(c.index, want[2], gen=c.gen)
            except SegmentError as e:
                if gone(e):
                    continue  # closed since conns was read: the next tick sees what replaced it
                raise
            self.missing.pop(k, None)
            self.written[k] = want
            notes.append(f"policy: conn {k}: slot {c.index} (gen {c.gen}) sup_bw={clamp(want[2])[0]}")


def _write_defaults(seg: Segment, w: Weights) -> None:
    """Writes w's class and peer defaults."""
    for k in sorted(w.cls):
        seg.set_class_hint(k, w.cls[k])
    for k in sorted(w.peers):
        ip, plen = parse_peer(k)
        seg.set_peer_hint(ip, w.peers[k], prefix_len=plen)
