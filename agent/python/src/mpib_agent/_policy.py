"""Telemetry rates, the proportional policy and a callback-style policy loop."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional

from ._format import SUP_BW_MAX, Slot
from ._segment import Segment, now_ns


@dataclass(frozen=True)
class ConnRate:
    """One connection's per-rail throughput between two samples."""

    slot: Slot
    sout_bps: float
    sup_bps: float
    sout_req_per_s: float
    sup_req_per_s: float

    @property
    def sup_share(self) -> float:
        t = self.sout_bps + self.sup_bps
        return self.sup_bps / t if t > 0 else 0.0


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
            )
        )
    return out


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
    return 512 if sout + sup == 0 else round(SUP_BW_MAX * sup / (sout + sup))


Policy = Callable[[List[ConnRate]], Optional[Dict[int, int]]]


def run_policy(
    seg: Segment,
    callback: Policy,
    interval: float = 1.0,
    *,
    duration: Optional[float] = None,
    stop: Optional[threading.Event] = None,
    beat_every: float = 0.1,
) -> None:
    """Beats the heartbeat every ``beat_every`` s and every ``interval`` s calls
    ``callback(rates)`` with the per-connection rates of the last interval; the callback
    returns {slot: sup_bw} to write (or None). Runs until ``duration`` elapses, ``stop`` is
    set, or KeyboardInterrupt; then clears the heartbeat (plugins fall back to vanilla)."""
    stop = stop or threading.Event()
    t0 = time.monotonic()
    prev = {s.index: s for s in seg.connections()}
    prev_t = now_ns()
    next_tick = t0 + interval
    seg.beat()
    try:
        while not stop.is_set():
            now = time.monotonic()
            if duration is not None and now - t0 >= duration:
                break
            if now >= next_tick:
                cur_t = now_ns()
                cur = {s.index: s for s in seg.connections()}
                hints = callback(rates(prev, cur, (cur_t - prev_t) / 1e9))
                prev, prev_t = cur, cur_t
                for slot, bw in (hints or {}).items():
                    seg.set_slot_hint(slot, bw)
                next_tick += interval
                if next_tick < now:
                    next_tick = now + interval
            seg.beat()
            stop.wait(min(beat_every, max(next_tick - time.monotonic(), 0.001)))
    except KeyboardInterrupt:
        pass
    finally:
        seg.stop_beat()


def install_sigterm_stop(stop: threading.Event) -> None:
    """Makes SIGTERM set ``stop`` (for daemons)."""
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
