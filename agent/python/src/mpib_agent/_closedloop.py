"""The closed-loop policy: extremum seeking on each send connection's split, no capacities
needed. The Go agent's policy.ClosedLoop (agent/go/policy/closedloop.go) is the same
algorithm with the same constants."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from ._format import SUP_BW_MAX
from ._policy import ConnRate

STEP = 64  # default initial probe step, parts per 1024
MAX_STEP = 256  # largest initial step
MIN_STEP = 8  # halving stops here
START = 512  # the split a new connection starts from
GAIN = 0.02  # a probe must beat the rate at w by more than this to move w
DRIFT = 0.15  # the rate at an unchanged w moving by more than this resets the step

CENTER, PLUS, MINUS = 0, 1, 2


def _clamp(w: int) -> int:
    return min(max(w, 0), SUP_BW_MAX)


@dataclass
class ClosedLoopConn:
    """The loop's state for one send connection (one registration of a slot)."""

    slot: int
    gen: int
    w: int  # the split the search is centred on (during a failover: the live rail's 0 or 1024)
    step: int  # the probe step
    phase: int = CENTER  # what the interval now running measures: w, w+step, w-step
    rate_w: float = 0.0  # this cycle's rate at w (bytes/s)
    rate_plus: float = 0.0  # this cycle's rate at w+step
    base: float = 0.0  # the last rate measured at w (0: none since a resume)
    saved_w: Optional[int] = None  # w before a failover (None: both rails up)
    still: int = 0  # cycles in a row at the smallest step without a move (reprobe)
    written: Optional[int] = None  # the value last returned for this connection

    @property
    def failover(self) -> bool:
        return self.saved_w is not None

    def target(self) -> int:
        """The split the coming interval runs at."""
        if self.saved_w is not None:
            return self.w
        if self.phase == PLUS:
            return _clamp(self.w + self.step)
        if self.phase == MINUS:
            return _clamp(self.w - self.step)
        return self.w


class ClosedLoopPolicy:
    """Moves every send connection's (``is_send == 1``) split to where its transfers finish
    fastest, without knowing the rails' capacities, and follows the rails when they change.
    A policy for :func:`mpib_agent.run_policy` (call it with each interval's
    :class:`~mpib_agent.ConnRate` list; it returns ``{slot: sup_bw}`` for the connections whose
    split changes). The CLI's ``run --policy closed-loop`` runs it.

    Per connection, one measurement per interval: the total posted rate
    ``r = Δ(sout_bytes + sup_bytes) / Δt`` of the slot's current ``gen``; an interval in which
    the gen changed (``rates`` leaves the slot out; a new registration starts again at 512) or
    no bytes moved is skipped (the same phase is measured again).

    - A cycle measures ``r`` at ``w``, then at the probe ``w + step``, then at ``w - step``
      (clamped to 0..1024), one interval each.
    - ``w`` moves to the best of the three when that probe beats the rate at ``w`` by more than
      2 %; otherwise the step halves (not below 8).
    - When the rate at an unchanged ``w`` differs from its last measurement by more than 15 %
      (a rail's capacity changed), the step returns to the initial step.
    - When telemetry shows a rail ``down`` or ``failed``, the split puts everything on the live
      rail (0 or 1024); once both rails are ``up`` again the search resumes from the previous
      ``w`` with the initial step. With both rails out of service nothing is written.

    ``step`` is the initial probe step (1..256, default 64), ``start`` the split a new
    connection starts from; ``note`` receives a line for the operator when ``w`` moves, a
    failover starts or ends, or the step resets.

    Limitation: a capacity *rise* at the balance point does not change the rate at ``w`` (the
    other rail still binds), so the step is not reset, and a probe of 8 towards the faster
    rail gains less than 2 %: ``w`` stays where it was (in the simulator, about 0.64 of the
    new optimum). ``reprobe`` (default 4, as the Go agent's ``DefaultReprobe``, which both
    CLIs use; 0 turns it off) returns the step to the initial step after that many cycles in
    a row at the smallest step without a move, which finds such a rise at the cost of a
    periodic larger probe (about 1.5 % in steady state).
    """

    def __init__(self, step: int = STEP, *, start: int = START, reprobe: int = 4,
                 note: Optional[Callable[[str], None]] = None) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= MAX_STEP:
            raise ValueError(f"step {step!r}: want an integer 1..{MAX_STEP}")
        self.step = step
        self.reprobe = reprobe
        self.start = _clamp(start)
        self.note = note
        self.conns: Dict[int, ClosedLoopConn] = {}

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
                c = ClosedLoopConn(slot=s.index, gen=s.gen, w=self.start, step=self.step)
                self.conns[s.index] = c
                self._say(f"closed-loop: slot {s.index} (gen {s.gen}) peer {s.peer_sout_ip}: "
                          f"start at sup_bw={c.w}, step {c.step}")
            else:
                self._measure(c, r)
            v = c.target()
            if c.written != v:
                c.written = v
                out[s.index] = v
        for i in list(self.conns):
            if i not in seen:
                del self.conns[i]
        return out

    def _measure(self, c: ClosedLoopConn, r: ConnRate) -> None:
        """Folds one interval of connection ``c`` into its state."""
        t = r.slot.telemetry
        sout_up, sup_up = t.sout_state == "up", t.sup_state == "up"
        if not sout_up and not sup_up:
            return  # nothing to steer: keep the hint in force
        if sout_up != sup_up:
            live = SUP_BW_MAX if sup_up else 0
            if c.saved_w is None:
                c.saved_w = c.w
                self._say(f"closed-loop: slot {c.slot} (gen {c.gen}): rails {t.sout_state}/{t.sup_state}: "
                          f"sup_bw={live} until both are up")
            c.w = live
            return
        if c.saved_w is not None:  # both rails up again: resume where the search was
            c.w, c.saved_w = c.saved_w, None
            c.step, c.phase, c.base = self.step, CENTER, 0.0
            self._say(f"closed-loop: slot {c.slot} (gen {c.gen}): rails up: resume at sup_bw={c.w}, step {c.step}")
            return
        rate = r.sout_bps + r.sup_bps
        if rate <= 0:
            return  # nothing moved: measure this phase again
        if c.phase == CENTER:
            if c.base > 0 and abs(rate / c.base - 1) > DRIFT and c.step != self.step:
                c.step = self.step
                self._say(f"closed-loop: slot {c.slot} (gen {c.gen}): rate at sup_bw={c.w} changed "
                          f"{100 * (rate / c.base - 1):+.0f}%: step {c.step}")
            c.rate_w, c.base, c.phase = rate, rate, PLUS
        elif c.phase == PLUS:
            c.rate_plus, c.phase = rate, MINUS
        else:
            c.phase = CENTER
            best_w, best = _clamp(c.w + c.step), c.rate_plus
            if rate > best:
                best_w, best = _clamp(c.w - c.step), rate
            if best > c.rate_w * (1 + GAIN) and best_w != c.w:
                self._say(f"closed-loop: slot {c.slot} (gen {c.gen}): sup_bw {c.w} -> {best_w} "
                          f"({100 * (best / c.rate_w - 1):+.1f}%), step {c.step}")
                c.w, c.base, c.still = best_w, best, 0
            else:
                half = max(c.step // 2, min(MIN_STEP, c.step))
                if half != c.step:
                    c.step, c.still = half, 0
                else:
                    c.still += 1
                    if self.reprobe > 0 and c.still >= self.reprobe:
                        c.step, c.still = self.step, 0


__all__ = ["ClosedLoopPolicy", "ClosedLoopConn", "STEP", "MAX_STEP", "MIN_STEP", "START", "GAIN", "DRIFT"]
