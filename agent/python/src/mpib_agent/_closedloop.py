"""The closed-loop policy: each send connection's split follows the rails' active rates, no
capacities needed. The Go agent's policy.ClosedLoop (agent/go/policy/closedloop.go) is the
same algorithm with the same constants."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ._layout import SUP_BW_MAX
from ._policy import ConnRate
from ._types import Telemetry, integer

STEP = 64  # default largest move of the split per interval, parts per 1024
MAX_STEP = 256  # largest step
START = 512  # the split a new connection starts from
MIN_SHARE = 8  # each rail keeps at least this share while both are up (so both stay measured)
GAIN = 0.5  # fraction of the way to the target taken per interval
NOTE_MOVE = 8  # moves of at least this much are noted for the operator
SMOOTH = 0.4  # weight of the newest measurement in a rail's smoothed bytes and active time


def _clamp(w: int) -> int:
    return min(max(w, 0), SUP_BW_MAX)


def _round(x: float) -> int:
    """Half away from zero, as Go's math.Round (Python's round() is half-even)."""
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def target(sout_bps: float, sup_bps: float) -> Optional[int]:
    """The split giving each rail a share of the bytes proportional to its active rate, kept
    within [MIN_SHARE, 1024 - MIN_SHARE]; None until both rates are known."""
    if not (sout_bps > 0 and sup_bps > 0) or math.isinf(sout_bps + sup_bps):
        return None
    x = _round(SUP_BW_MAX * sup_bps / (sout_bps + sup_bps))
    return min(max(x, MIN_SHARE), SUP_BW_MAX - MIN_SHARE)


def move(w: int, to: int, gain: float, max_step: int) -> int:
    """The next split from ``w`` toward ``to``: ``gain`` of the way, rounded, at most
    ``max_step``, and at least 1 while ``w`` differs from ``to``."""
    m = _round((to - w) * gain)
    if m == 0 and to != w:
        m = 1 if to > w else -1
    return _clamp(w + min(max(m, -max_step), max_step))


def _rail(t: Telemetry, r: int) -> Tuple[int, int]:
    """Rail r's completed bytes and active time."""
    if r == 0:
        return t.sout_completed_bytes, t.sout_active_ns
    return t.sup_completed_bytes, t.sup_active_ns


@dataclass
class ClosedLoopConn:
    """The loop's state for one send connection (one registration of a slot)."""

    slot: int
    gen: int
    w: int  # the split in force (during a failover: the live rail's 0 or 1024)
    mark: List[Tuple[int, int]] = field(default_factory=lambda: [(0, 0), (0, 0)])  # per rail at the last rate
    rate: List[float] = field(default_factory=lambda: [0.0, 0.0])  # active rate per rail, bytes/s; 0 unknown
    avg: List[Tuple[float, float]] = field(default_factory=lambda: [(0.0, 0.0), (0.0, 0.0)])  # smoothed bytes, ns
    saved_w: Optional[int] = None  # w before a failover (None: both rails up)
    written: Optional[int] = None  # the value last returned for this connection

    @property
    def failover(self) -> bool:
        return self.saved_w is not None

    @property
    def target_known(self) -> bool:
        return target(self.rate[0], self.rate[1]) is not None

    def remark(self, t: Telemetry) -> None:
        """Both rails' next measurement starts at ``t``; their rates are forgotten."""
        self.mark = [_rail(t, 0), _rail(t, 1)]
        self.rate = [0.0, 0.0]
        self.avg = [(0.0, 0.0), (0.0, 0.0)]

    def measure_rates(self, t: Telemetry) -> None:
        """Each rail's active rate from what it completed since its mark; a rail that completed
        nothing keeps its rate and its active time counts toward the next measurement."""
        for r in (0, 1):
            (b, a), (mb, ma) = _rail(t, r), self.mark[r]
            if b < mb or a < ma:  # counters went back: start again
                self.mark[r], self.rate[r], self.avg[r] = (b, a), 0.0, (0.0, 0.0)
            elif b > mb and a > ma:
                nb, na = float(b - mb), float(a - ma)
                if self.rate[r] > 0:
                    nb = SMOOTH * nb + (1 - SMOOTH) * self.avg[r][0]
                    na = SMOOTH * na + (1 - SMOOTH) * self.avg[r][1]
                self.avg[r] = (nb, na)
                self.rate[r] = nb / (na / 1e9)
                self.mark[r] = (b, a)


class ClosedLoopPolicy:
    """Moves every send connection's (``is_send == 1``) split to where its transfers finish
    fastest, without knowing the rails' capacities, and follows the rails when they change.
    A policy for :func:`mpib_agent.run_policy` (call it with each interval's
    :class:`~mpib_agent.ConnRate` list; it returns ``{slot: sup_bw}`` for the connections whose
    split changes). The CLI's ``run --policy closed-loop`` runs it.

    Per connection and interval it measures each rail's *active rate*: the bytes the rail
    completed over the time it had at least one of the connection's requests in flight
    (``Δ*_completed_bytes / Δ*_active_ns``). That rate does not depend on the
    split: a rail that is the bottleneck never idles, so its active rate is its capacity; a
    rail that is not finishes each part at its capacity plus its latency. The best split gives
    each rail a share proportional to its active rate, so that both parts of a message finish
    together:

    - target = 1024 * rate_SUP / (rate_SOUT + rate_SUP), kept within [8, 1016] so that both
      rails stay measured;
    - ``w`` moves half of the way to the target (``gain``), by at most ``step`` per interval;
    - each rail's rate is the ratio of its smoothed completed bytes and active time (each an
      exponential average over measurements, weight 0.4 for the newest): one interval of a
      rail shaped by a queue carries a few messages, and their count jitters;
    - a rail that completed nothing in an interval keeps its last rate, and that interval's
      active time counts toward its next measurement (a stalled rail's rate falls);
    - a new registration (gen) starts again at 512 with no rates;
    - when telemetry shows a rail ``down`` or ``failed``, the split puts everything on the
      live rail (0 or 1024); once both rails are ``up`` again the loop resumes from the
      previous ``w`` with fresh rates. With both rails out of service nothing is written.

    Steering on posted bytes (what an earlier version did, by probing w±step) fails behind a
    queue: posting goes on into a shaped rail's queue, so a probe looks good until the queue
    fills. Completed bytes over active time see the queue's drain rate, which is the capacity.

    ``step`` is the largest move per interval (1..256, default 64), ``gain`` the fraction of
    the way to the target per interval (0 < gain <= 1), ``start`` the split a new connection
    starts from; ``note`` receives a line for the operator when ``w`` moves by 8 or more, or
    a failover starts or ends.
    """

    def __init__(
        self, step: int = STEP, *, gain: float = GAIN, start: int = START, note: Optional[Callable[[str], None]] = None
    ) -> None:
        n = integer(step)
        if n is None or not 1 <= n <= MAX_STEP:
            raise ValueError(f"step {step!r}: want an integer 1..{MAX_STEP}")
        if not 0 < gain <= 1:
            raise ValueError(f"gain {gain!r}: want a number in (0, 1]")
        self.step, self.gain = n, gain
        self.start = _clamp(start)
        self.note = note
        self.conns: Dict[int, ClosedLoopConn] = {}

    def segment_replaced(self) -> None:
        """Tells the policy that its segment was replaced (re-created at its path): its
        connections registered again there, in new slots with new generations, and nothing it
        wrote is there. It forgets every connection, so that the next call starts each one as
        a new registration and returns its split."""
        self.conns.clear()

    def _say(self, msg: str) -> None:
        if self.note is not None:
            self.note(msg)

    def __call__(self, rates: List[ConnRate]) -> Dict[int, int]:
        out: Dict[int, int] = {}
        seen = set()
        for r in rates:
            s = r.slot
            if s.is_send != 1:
                continue
            seen.add(s.index)
            c = self.conns.get(s.index)
            if c is None or c.gen != s.gen:
                c = ClosedLoopConn(slot=s.index, gen=s.gen, w=self.start)
                c.remark(s.telemetry)
                self.conns[s.index] = c
                self._say(f"closed-loop: slot {s.index} (gen {s.gen}) peer {s.peer_sout_ip}: start at sup_bw={c.w}")
            else:
                self._measure(c, s.telemetry)
            if c.written != c.w:
                c.written = c.w
                out[s.index] = c.w
        for i in list(self.conns):
            if i not in seen:
                del self.conns[i]
        return out

    def _measure(self, c: ClosedLoopConn, t: Telemetry) -> None:
        """Folds one interval of connection ``c`` into its state and moves ``w``."""
        sout_up, sup_up = t.sout_state == "up", t.sup_state == "up"
        if not sout_up and not sup_up:
            return  # nothing to steer: keep the hint in force
        if sout_up != sup_up:
            live = SUP_BW_MAX if sup_up else 0
            if c.saved_w is None:
                c.saved_w = c.w
                self._say(
                    f"closed-loop: slot {c.slot} (gen {c.gen}): rails {t.sout_state}/{t.sup_state}: "
                    f"sup_bw={live} until both are up"
                )
            c.w = live
            return
        if c.saved_w is not None:  # both rails up again: resume where it was, measure afresh
            c.w, c.saved_w = c.saved_w, None
            c.remark(t)
            self._say(f"closed-loop: slot {c.slot} (gen {c.gen}): rails up: resume at sup_bw={c.w}")
            return
        c.measure_rates(t)
        to = target(c.rate[0], c.rate[1])
        if to is None:
            return
        nxt = move(c.w, to, self.gain, self.step)
        if abs(nxt - c.w) >= NOTE_MOVE:
            self._say(
                f"closed-loop: slot {c.slot} (gen {c.gen}): sup_bw {c.w} -> {nxt} (target {to}: "
                f"SOUT {c.rate[0] * 8 / 1e6:.1f}, SUP {c.rate[1] * 8 / 1e6:.1f} Mbit/s while active)"
            )
        c.w = nxt


__all__ = ["ClosedLoopPolicy", "ClosedLoopConn", "STEP", "MAX_STEP", "START", "MIN_SHARE", "GAIN", "target", "move"]
