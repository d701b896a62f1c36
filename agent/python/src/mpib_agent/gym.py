"""A gym-style environment over the simulator (no gym dependency): learn or tune a split
policy against :mod:`mpib_agent.sim` on the virtual clock.

>>> env = SplitEnv("4to1", seed=1)
>>> obs, info = env.reset()
>>> obs, reward, terminated, truncated, info = env.step(278)   # or a float 0..1: env.step(0.27)
>>> env.close()

Each step writes the action as the slot hint of every send connection of the scenario (for
its current ``gen``, through a real segment in a temporary directory, beaten by the env as an
agent), runs ``interval`` simulated seconds, and reads the telemetry back.

- ``obs``: a dict: ``sout_mbps``, ``sup_mbps`` (posted rates of the send connections, summed,
  Mbit/s, from the telemetry), ``sup_bw`` (the split the plugin applied: ``last_sup_bw`` of
  the first send connection), ``sout_state``/``sup_state`` (``up``, ``down``, ``failed``: the
  worst over the send connections), ``t`` (simulated seconds), and from the completion
  telemetry: ``sout_completed_mbps``, ``sup_completed_mbps`` (delivered rates, summed),
  ``sout_latency_us``, ``sup_latency_us`` (mean completion latency of the first send
  connection over the step, 0 when nothing completed) and ``applied_sup_bw`` (its split after
  failover: 0 or 1024 while a rail is out, whatever the action).
- ``reward``: the bytes the send connections moved during the step divided by what the best
  split would have moved (noise-free), about 1.0 at the optimum.
- ``info``: ``optimum_mbps``, ``achieved_mbps``, ``optimum_sup_bw`` (of the first send
  connection), ``t``.
- ``terminated`` is always False; ``truncated`` once ``max_steps`` steps ran (default: the
  scenario's duration / interval).
"""

from __future__ import annotations

import numbers
import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Tuple, Union

from ._format import RAIL_STATES, SUP_BW_MAX
from ._policy import rates
from ._segment import Segment, open_segment
from .sim import Scenario, Simulator

Obs = Dict[str, Any]


def action_sup_bw(action: Union[int, float]) -> int:
    """An action as sup_bw: an int 0..1024, or a float 0.0..1.0 (the SUP share)."""
    if isinstance(action, bool) or not isinstance(action, numbers.Real):
        raise ValueError(f"action {action!r}: want an int 0..1024 or a float 0.0..1.0")
    if isinstance(action, numbers.Integral):
        v = int(action)
        if not 0 <= v <= SUP_BW_MAX:
            raise ValueError(f"action {action!r}: want an int 0..1024 or a float 0.0..1.0")
        return v
    f = float(action)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"action {action!r}: want an int 0..1024 or a float 0.0..1.0")
    return int(f * SUP_BW_MAX + 0.5)


def _worst(states: Any) -> str:
    return max(states, key=lambda s: RAIL_STATES.index(s) if s in RAIL_STATES else len(RAIL_STATES), default="up")


class SplitEnv:
    """See the module's docstring. ``scenario``: a name of :data:`mpib_agent.sim.SCENARIOS` or
    a :class:`~mpib_agent.sim.Scenario`; ``interval``: simulated seconds per step; ``seed``:
    the noise's seed (``reset(seed=...)`` overrides it)."""

    def __init__(self, scenario: Union[str, Scenario] = "equal", interval: float = 0.5, seed: Optional[int] = None,
                 max_steps: Optional[int] = None, tick: float = 0.01) -> None:
        if not interval > 0:
            raise ValueError(f"interval {interval!r}: want seconds above 0")
        self.scenario = scenario
        self.interval = interval
        self.seed = seed
        self.tick = tick
        self._max_steps = max_steps
        self._dir: Optional[str] = None
        self.sim: Optional[Simulator] = None
        self.seg: Optional[Segment] = None
        self.steps = 0
        self._prev: Dict[int, Tuple[int, int]] = {}

    @property
    def max_steps(self) -> int:
        if self._max_steps is not None:
            return self._max_steps
        dur = self.sim.scenario.duration if self.sim is not None else 30.0
        return max(1, int(round(dur / self.interval)))

    def close(self) -> None:
        if self.seg is not None:
            self.seg.release_agent()
            self.seg.close()
            self.seg = None
        if self.sim is not None:
            self.sim.close()
            self.sim = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> "SplitEnv":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, seed: Optional[int] = None) -> Tuple[Obs, Dict[str, Any]]:
        """A fresh simulation (new segment): runs one interval at the vanilla split and returns
        its observation."""
        self.close()
        if seed is not None:
            self.seed = seed
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self._dir = tempfile.mkdtemp(prefix="mpib-gym-", dir=base)
        path = os.path.join(self._dir, "hints")
        self.sim = Simulator(self.scenario, path, seed=self.seed, tick=self.tick, nslots=64, npeers=0)
        self.seg = open_segment(path)
        self.seg.acquire_agent()
        self.sim.agent = self.seg
        self.steps = 0
        self._prev = {c.index: (0, 0) for c in self.sim.conns}
        obs, info, _ = self._run()
        return obs, info

    def step(self, action: Union[int, float]) -> Tuple[Obs, float, bool, bool, Dict[str, Any]]:
        if self.sim is None or self.seg is None:
            raise RuntimeError("call reset() first")
        w = action_sup_bw(action)
        for c in self.sim.conns:
            if c.spec.is_send:
                self.seg.set_slot_hint(c.slot, w, gen=c.gen)
        obs, info, reward = self._run()
        self.steps += 1
        return obs, reward, False, self.steps >= self.max_steps, info

    def _run(self) -> Tuple[Obs, Dict[str, Any], float]:
        assert self.sim is not None and self.seg is not None
        sim = self.sim
        before = {c.index: (c.delivered, c.optimal) for c in sim.conns}
        snap0 = {s.index: s for s in self.seg.connections()}
        sim.advance(self.interval)
        snap = {s.index: s for s in self.seg.connections()}
        sends = [c for c in sim.conns if c.spec.is_send]
        moved = sum(c.delivered - before[c.index][0] for c in sends)
        best = sum(c.optimal - before[c.index][1] for c in sends)
        rs = {r.slot.index: r for r in rates(snap0, snap, self.interval)}
        mine = [rs[c.slot] for c in sends if c.slot in rs]
        first = snap.get(sends[0].slot) if sends else None
        lead = rs.get(sends[0].slot) if sends else None
        obs: Obs = {
            "sout_mbps": sum(r.sout_bps for r in mine) * 8e-6,
            "sup_mbps": sum(r.sup_bps for r in mine) * 8e-6,
            "sup_bw": first.telemetry.last_sup_bw if first is not None else 0,
            "sout_state": _worst([snap[c.slot].telemetry.sout_state for c in sends if c.slot in snap]),
            "sup_state": _worst([snap[c.slot].telemetry.sup_state for c in sends if c.slot in snap]),
            "t": sim.t,
            "sout_completed_mbps": sum(r.sout_completed_bps for r in mine) * 8e-6,
            "sup_completed_mbps": sum(r.sup_completed_bps for r in mine) * 8e-6,
            "sout_latency_us": lead.sout_latency_ns / 1e3 if lead is not None else 0.0,
            "sup_latency_us": lead.sup_latency_ns / 1e3 if lead is not None else 0.0,
            "applied_sup_bw": first.telemetry.applied_sup_bw if first is not None else 0,
        }
        info = {
            "optimum_mbps": best * 8 / self.interval / 1e6,
            "achieved_mbps": moved * 8 / self.interval / 1e6,
            "optimum_sup_bw": sends[0].optimum()[0] if sends else 0,
            "t": sim.t,
        }
        return obs, info, (moved / best if best > 0 else 0.0)


__all__ = ["SplitEnv", "action_sup_bw"]
