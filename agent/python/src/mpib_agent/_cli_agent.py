"""mpib-agent-py's agent commands: heartbeat (and its alias daemon), and run, a policy loop
(static, proportional, closed-loop) that also beats and reclaims dead processes' slots."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from ._cli_args import _UINT_RE, UsageError, _capacity, _duration_s, _fmt_ms
from ._closedloop import MAX_STEP, ClosedLoopPolicy
from ._policy import (
    Proportional,
    StaticWeights,
    agent_loop,
    gone,
    rate_sampler,
    rates,
    replacement_watch,
    signal_setter,
)
from ._resolve import clamp
from ._segment import Segment, beat_period_s, now_ns, open_segment
from ._types import SegmentError

RECLAIM_PERIOD_S = 5.0  # a beating agent's reclaim passes at most this far apart (spec 5.7)


def reclaim_due(last: Optional[float], now: float) -> bool:
    """Whether a policy loop's tick at ``now`` runs the reclaim pass, the last one having run at
    ``last`` (None: none yet, so the first tick runs one): every tick of a loop slower than
    RECLAIM_PERIOD_S, about every RECLAIM_PERIOD_S of a faster one. Slots of dead plugins come
    back and records a dead writer left half-written are repaired (spec 5.1)."""
    return last is None or now - last >= RECLAIM_PERIOD_S


def _loop(seg: Segment, tick: Callable[[], None], interval: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, signal_setter(stop))
    signal.signal(signal.SIGINT, signal_setter(stop))
    agent_loop(seg, tick, interval, stop=stop)


def _cmd_heartbeat(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        seg.acquire_agent()
        print(
            f"heartbeat: pid {os.getpid()} beating {a.path} every {_fmt_ms(beat_period_s())} "
            "(stop with SIGINT/SIGTERM)",
            flush=True,
        )

        def tick() -> None:
            seg.gc()

        _loop(seg, tick, 5.0)
    return 0


def _static_tick(seg: Segment, path: str) -> Callable[[], None]:
    p = StaticWeights(path)
    replaced = replacement_watch(seg)

    def tick() -> None:
        if replaced():
            p.segment_replaced()
        for n in p.tick(seg, seg.connections()):
            print(n, flush=True)

    return tick


def _proportional_tick(seg: Segment, p: Proportional) -> Callable[[], None]:
    state: Dict[str, object] = {"prev": {s.index: s for s in seg.connections()}, "t": now_ns()}
    last: Dict[int, Tuple[int, int]] = {}
    replaced = replacement_watch(seg)

    def tick() -> None:
        if replaced():  # nothing written is in the new segment; its counters are not prev's
            last.clear()
            state["prev"], state["t"] = {}, now_ns()
        conns = seg.connections()
        cur_t, cur = now_ns(), {s.index: s for s in conns}
        prev = state["prev"]
        assert isinstance(prev, dict)
        p.observe(rates(prev, cur, (cur_t - int(state["t"])) / 1e9))  # type: ignore[call-overload]
        state["prev"], state["t"] = cur, cur_t
        bw = p.sup_bw()
        for c in conns:
            if c.is_send != 1 or last.get(c.index) == (c.gen, bw):
                continue
            try:
                seg.set_slot_hint(c.index, bw, gen=c.gen)
            except SegmentError as e:
                if gone(e):
                    continue  # closed since the sample: the next tick sees what replaced it
                raise
            last[c.index] = (c.gen, bw)
            print(f"policy: slot {c.index} (gen {c.gen}) peer {c.peer_sout_ip} sup_bw={clamp(bw)[0]}", flush=True)

    return tick


def _closed_loop_tick(seg: Segment, p: ClosedLoopPolicy) -> Callable[[], None]:
    next_sample = rate_sampler(seg)
    replaced = replacement_watch(seg)

    def tick() -> None:
        if replaced():
            p.segment_replaced()
        cur, rs = next_sample()
        hints = p(rs)
        for slot, bw in hints.items():
            try:
                seg.set_slot_hint(slot, bw, gen=cur[slot].gen)
            except SegmentError as e:
                if gone(e):
                    p.conns.pop(slot, None)  # closed since the sample: the next tick sees what replaced it
                    continue
                raise

    return tick


def _step(s: str) -> int:
    if _UINT_RE.match(s) is None or not s.isascii() or not 1 <= int(s) <= MAX_STEP:
        raise UsageError(f"--step {s!r}: want an integer 1..{MAX_STEP} (parts per 1024)")
    return int(s)


def _cmd_run(a: argparse.Namespace) -> int:
    caps = (0.0, 0.0)
    if a.policy == "static":
        if not a.file:
            raise UsageError("--policy static needs --file weights.json")
    elif a.policy == "proportional":
        caps = _capacity(a.capacity)
    elif a.policy != "closed-loop":
        raise UsageError(f"--policy {a.policy!r}: want static, proportional or closed-loop")
    if a.step is not None and a.policy != "closed-loop":
        raise UsageError("--step goes with --policy closed-loop")
    step = _step(a.step) if a.step is not None else 64
    interval = _duration_s(
        "interval", a.interval if a.interval is not None else ("0.5" if a.policy == "closed-loop" else "1")
    )
    with open_segment(a.path) as seg:
        seg.acquire_agent()
        if a.policy == "static":
            tick = _static_tick(seg, a.file)
        elif a.policy == "closed-loop":
            tick = _closed_loop_tick(seg, ClosedLoopPolicy(step, note=lambda s: print(s, flush=True)))
        else:
            tick = _proportional_tick(seg, Proportional(cap_sout=caps[0], cap_sup=caps[1]))
        print(
            f"run: pid {os.getpid()}, policy {a.policy}, interval {_fmt_ms(interval)}, segment {a.path}, "
            f"beat every {_fmt_ms(beat_period_s())}",
            flush=True,
        )
        last_gc: List[Optional[float]] = [None]

        def with_gc() -> None:
            tick()
            now = time.monotonic()
            if reclaim_due(last_gc[0], now):
                last_gc[0] = now
                seg.gc()

        _loop(seg, with_gc, interval)
    return 0
