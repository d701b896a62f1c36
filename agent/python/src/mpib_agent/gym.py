"""Gymnasium environments over the simulator: learn or tune a split policy against
:mod:`mpib_agent.sim` on the virtual clock. Needs the ``gym`` extra
(``pip install mpib-agent[gym]``: gymnasium and numpy); the rest of the package stays
standard-library only.

Importing this module registers two ids (a second import, or a reload, registers nothing):

- ``mpib/Split-v0`` (:class:`SplitEnv`): one action for every send connection of the scenario,
  ``Box(0, 1, shape=(1,))``;
- ``mpib/SplitPerConn-v0`` (:class:`SplitPerConnEnv`): one action per send connection,
  ``Box(0, 1, shape=(n,))``, n fixed by the scenario at construction (2 on ``2to1``).

>>> import gymnasium, mpib_agent.gym
>>> env = gymnasium.make("mpib/SplitPerConn-v0", scenario="2to1", render_mode="ansi")
>>> obs, info = env.reset(seed=1)
>>> obs, reward, terminated, truncated, info = env.step([0.67, 0.33])
>>> print(env.render()); env.close()

Keyword arguments (of the classes and of ``gymnasium.make``): ``scenario`` (a name of
:data:`mpib_agent.sim.SCENARIOS`, default ``2to1``, or a :class:`~mpib_agent.sim.Scenario`),
``interval`` (simulated seconds per step, default 0.5), ``max_steps`` (default: the scenario's
duration / interval), ``tick`` (the simulator's tick), ``peak_half_life`` (simulated seconds,
see the reward) and ``render_mode`` (None or ``"ansi"``).

**Action**: the SUP fraction of each message, in [0, 1]: 0.0 all on SOUT, 1.0 all on SUP
(``sup_bw = round(1024 * a)``). ``step`` takes a numpy array, a list or a float (a single
number applies to every connection); values outside [0, 1] are clipped, NaN is refused. Each
step writes the hint of every send connection (for its current ``gen``, through a real segment
at the env's own temporary path, beaten by the env as the agent), runs ``interval`` simulated
seconds and reads the telemetry back, as an agent on a live node does.

**Observation**: a Dict of Boxes, one row per send connection (in the scenario's order; receive
connections read no hints and are left out), columns ``[SOUT, SUP]``, all from the telemetry
of the step (two samples of the same ``gen``, as ``top --json`` computes them):

- ``completed_gbps`` (float32, (n, 2)): completed bytes per rail over the step, Gbit/s;
- ``active_gbps`` (float32, (n, 2)): completed bytes over the rail's active time (a request in
  flight on it), Gbit/s, 0 when it completed nothing: what the rail delivers while it has work,
  the signal the closed loop steers on (docs/agent.md);
- ``latency_us`` (float32, (n, 2)): mean completion latency of the step's requests, 0 when none;
- ``inflight_bytes`` (float32, (n, 2)): bytes posted and not completed at the last flush;
- ``rail_state`` (int64, (n, 2)): 0 up, 1 down, 2 failed (an unknown state reads as 2);
- ``split`` (float32, (n,)): the split the plugin applied to its last message as a fraction
  (``applied_sup_bw / 1024``: after failover, so 0 or 1 while a rail is out, whatever the
  action; and after the plugin's guard, so 0 on an inter-island connection unless the
  scenario has ``sup_relay``).

Rates are capped at 10 Tbit/s and latencies at 10 s (the spaces are bounded).

**Reward** (see :meth:`SplitEnv.step`): the step's completed throughput over the sum of the
rails' recent peak rates, computable from the counters on a live cluster too; about 1.0 when
every rail is busy at its capacity. The simulator's ground truth (throughput over the optimum's)
is ``info["oracle_ratio"]``, for evaluation only.

``reset`` runs one interval at the split 0.5 (the closed loop's start, so both rails are
measured) and returns its observation; ``terminated`` is always False (no terminal state),
``truncated`` True once ``max_steps`` steps ran; stepping after that raises RuntimeError until
``reset``. ``close()`` removes the env's segment (a finalizer does if the env is never closed).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import weakref
from typing import Any, Dict, List, Optional, Sequence, SupportsFloat, Tuple, Union

try:
    import gymnasium
    import numpy as np
    from gymnasium import spaces
except ImportError as e:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(f"mpib_agent.gym needs gymnasium and numpy ({e}): pip install mpib-agent[gym]") from e

from ._layout import RAIL_STATES, SUP_BW_MAX
from ._policy import ConnRate, rates
from ._segment import Segment, open_segment
from .sim import Scenario, SimConn, Simulator
from .sim import scenario as _scenario

Obs = Dict[str, Any]  # each value a numpy array
Action = Union[SupportsFloat, Sequence[SupportsFloat], "np.ndarray[Any, Any]"]

START_SPLIT = 0.5  # the split of every send connection during reset's interval
MAX_GBPS = 10_000.0  # rates are capped at this (Gbit/s), so that the spaces are bounded
MAX_LATENCY_US = 1e7
MAX_INFLIGHT = float(1 << 40)
STATE_UNKNOWN = len(RAIL_STATES) - 1  # an unknown rail state reads as failed


def sup_bw(fraction: float) -> int:
    """A SUP fraction in [0, 1] (clipped) as the hint's sup_bw, parts per 1024."""
    f = min(max(float(fraction), 0.0), 1.0)
    return int(f * SUP_BW_MAX + 0.5)


def action_fractions(action: Action, n: int) -> "np.ndarray[Any, np.dtype[np.float64]]":
    """An action (a float, a list or an array of 1 or ``n`` numbers) as ``n`` SUP fractions
    clipped to [0, 1]; a single number applies to all ``n``. ValueError for anything else,
    or NaN."""
    want = f"action {action!r}: want a number or {n} numbers in [0, 1] (1.0: all on SUP)"
    try:
        raw = np.asarray(action)
    except (TypeError, ValueError) as e:
        raise ValueError(want) from e
    if raw.dtype.kind not in "biuf":  # strings, None, ragged lists
        raise ValueError(want)
    a = raw.astype(np.float64).reshape(-1)
    if a.size == 1:
        a = np.full(n, a[0])
    if a.size != n or np.isnan(a).any():
        raise ValueError(want)
    return np.clip(a, 0.0, 1.0)


class _Resources:
    """What an env holds outside the interpreter: its directory (the segment's), the simulator
    and the agent's Segment. Shared with the env's finalizer, so it never refers to the env."""

    def __init__(self) -> None:
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir: Optional[str] = tempfile.mkdtemp(prefix="mpib-gym-", dir=base)
        self.path = os.path.join(self.dir, "hints")
        self.sim: Optional[Simulator] = None
        self.seg: Optional[Segment] = None

    def stop(self) -> None:
        """Ends the simulation (releases its slots and the agent lock); the directory stays."""
        if self.seg is not None:
            self.seg.release_agent()
            self.seg.close()
            self.seg = None
        if self.sim is not None:
            self.sim.close()
            self.sim = None

    def close(self) -> None:
        self.stop()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


def _state(s: str) -> int:
    return RAIL_STATES.index(s) if s in RAIL_STATES else STATE_UNKNOWN


class _SimEnv(gymnasium.Env[Obs, "np.ndarray[Any, Any]"]):
    """The two envs' common part; see the module's docstring."""

    metadata: Dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 2}

    def __init__(
        self,
        scenario: Union[str, Scenario] = "2to1",
        interval: float = 0.5,
        max_steps: Optional[int] = None,
        tick: float = 0.01,
        peak_half_life: float = 5.0,
        render_mode: Optional[str] = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval {interval!r}: want simulated seconds above 0")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps {max_steps!r}: want at least 1")
        if not peak_half_life > 0:
            raise ValueError(f"peak_half_life {peak_half_life!r}: want simulated seconds above 0")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r}: want None or one of {self.metadata['render_modes']}")
        self.scenario = _scenario(scenario)
        self.sends = [i for i, c in enumerate(self.scenario.conns) if c.is_send]
        if not self.sends:
            raise ValueError(f"scenario {self.scenario.name}: no send connection to steer")
        self.n_conns = len(self.sends)
        self.interval = float(interval)
        self.tick = tick
        self.max_steps = max_steps if max_steps is not None else max(1, int(round(self.scenario.duration / interval)))
        self.peak_decay = 0.5 ** (self.interval / peak_half_life)
        self.render_mode = render_mode
        n = self.n_conns
        rate = spaces.Box(0.0, MAX_GBPS, shape=(n, 2), dtype=np.float32)
        self.observation_space = spaces.Dict(
            {
                "completed_gbps": rate,
                "active_gbps": rate,
                "latency_us": spaces.Box(0.0, MAX_LATENCY_US, shape=(n, 2), dtype=np.float32),
                "inflight_bytes": spaces.Box(0.0, MAX_INFLIGHT, shape=(n, 2), dtype=np.float32),
                "rail_state": spaces.Box(0, STATE_UNKNOWN, shape=(n, 2), dtype=np.int64),
                "split": spaces.Box(0.0, 1.0, shape=(n,), dtype=np.float32),
            }
        )
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.close)
        self.steps = 0
        self._done = False
        self._peak = np.zeros((n, 2))  # bytes/s per connection and rail
        self._last: Optional[Tuple[Obs, float, Dict[str, Any]]] = None

    # -- resources ------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The env's segment: a file in its own temporary directory (in /dev/shm when it is
        writable; never the default /dev/shm/mpib-hints-EUID). Removed by ``close``; a reset
        after that takes a new one."""
        return self._res.path

    @property
    def sim(self) -> Optional[Simulator]:
        """The simulator of the episode (None before ``reset`` and after ``close``)."""
        return self._res.sim

    def close(self) -> None:
        """Ends the simulation and removes the segment and its directory; may be called again."""
        self._finalizer()
        self._last = None

    # -- the Gymnasium API ----------------------------------------------------------------

    def reset(
        self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None
    ) -> Tuple[Obs, Dict[str, Any]]:
        """A fresh simulation on a new segment, its noise seeded from ``self.np_random``
        (``seed`` re-seeds that generator for this and the following resets; without it the
        generator goes on, so each reset differs). Runs one interval with every send
        connection at the split 0.5 and returns its observation and info. ``options`` takes no
        keys."""
        super().reset(seed=seed)
        if options:
            raise ValueError(f"options {sorted(options)}: this env takes none")
        if self._res.dir is None:  # closed, then used again
            self._res = _Resources()
            self._finalizer = weakref.finalize(self, self._res.close)
        path = self._res.path
        self._res.stop()
        if os.path.lexists(path):
            os.unlink(path)
        conns = len(self.scenario.conns)
        sim_seed = int(self.np_random.integers(0, 2**63 - 1))
        self._res.sim = Simulator(
            self.scenario, path, seed=sim_seed, tick=self.tick, nslots=max(64, 4 * conns), npeers=0
        )
        self._res.seg = open_segment(path)
        self._res.seg.acquire_agent()
        self._res.sim.agent = self._res.seg
        self.steps = 0
        self._done = False
        self._peak = np.zeros((self.n_conns, 2))
        self._write(np.full(self.n_conns, START_SPLIT))
        obs, reward, info = self._run()
        self._last = (obs, reward, info)
        return obs, info

    def step(self, action: Action) -> Tuple[Obs, float, bool, bool, Dict[str, Any]]:
        """Applies ``action`` (SUP fractions, 1.0: all on SUP) for ``interval`` simulated
        seconds. The reward, from the counters of the step (bytes/s; c: a send connection,
        r: its rail, SOUT or SUP):

        - ``X[c,r]``: the bytes rail r of c completed in the step over ``interval``;
        - ``A[c,r]``: the same bytes over the rail's active time in the step (0 when none);
        - ``P[c,r]``, the rail's recent peak rate: 0 while the rail is down or failed (it can
          carry nothing); else, when it completed bytes in the step,
          ``max(d * P[c,r], A[c,r], X[c,r])`` with ``d = 0.5 ** (interval / peak_half_life)``
          (it halves every ``peak_half_life`` simulated seconds unless measured again);
          unchanged when the rail carried nothing (no measurement); 0 at reset;
        - ``reward = sum(X) / sum(P)`` (0 while ``sum(P)`` is 0), in [0, 1].

        A live agent has the same counters (``*_completed_bytes``, ``*_active_ns``, the rail
        states), so it can compute the same reward. ``info`` holds ``completed_mbps`` and
        ``peak_mbps`` (its numerator and denominator, Mbit/s), ``t``, ``step`` and the
        simulator's ground truth, for evaluation only: ``oracle_ratio`` (the bytes the send
        connections moved over what the best split would have moved, noise-free),
        ``achieved_mbps``, ``optimum_mbps`` and ``optimum_split`` (per connection, as a
        fraction)."""
        if self._res.sim is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError(f"the episode ended (truncated after {self.steps} steps): call reset() before step()")
        self._write(self._fractions(action))
        obs, reward, info = self._run()
        self.steps += 1
        truncated = self.steps >= self.max_steps
        self._done = truncated
        self._last = (obs, reward, info)
        return obs, reward, False, truncated, info

    def render(self) -> Optional[str]:
        """``"ansi"``: a text frame of the last step (None without a render mode)."""
        if self.render_mode is None:
            return None
        name = self.spec.id if self.spec is not None else type(self).__name__
        if self._last is None:
            return f"{name} ({self.scenario.name}): call reset()\n"
        obs, reward, info = self._last
        lines = [
            f"{name} ({self.scenario.name}) t={info['t']:.2f}s step {self.steps}/{self.max_steps} "
            f"reward {reward:.3f} oracle {info['oracle_ratio']:.3f}"
        ]
        sim = self._res.sim
        for k, i in enumerate(self.sends):
            slot = sim.conns[i].slot if sim is not None else -1
            rails = []
            for r, rail in enumerate(("SOUT", "SUP")):
                rails.append(
                    f"{rail} {RAIL_STATES[int(obs['rail_state'][k, r])]:<6} "
                    f"{obs['completed_gbps'][k, r]:7.1f}/{obs['active_gbps'][k, r]:7.1f} Gb/s"
                )
            lines.append(f"  conn {i} (slot {slot}): split {obs['split'][k]:.3f}  " + "  ".join(rails))
        return "\n".join(lines) + "\n"

    # -- the model's plumbing -------------------------------------------------------------

    def _fractions(self, action: Action) -> "np.ndarray[Any, np.dtype[np.float64]]":
        raise NotImplementedError

    def _send_conns(self) -> List[SimConn]:
        assert self._res.sim is not None
        return [self._res.sim.conns[i] for i in self.sends]

    def _write(self, fractions: "np.ndarray[Any, np.dtype[np.float64]]") -> None:
        seg = self._res.seg
        assert seg is not None
        for c, f in zip(self._send_conns(), fractions):
            seg.set_slot_hint(c.slot, sup_bw(f), gen=c.gen)

    def _run(self) -> Tuple[Obs, float, Dict[str, Any]]:
        """Runs one interval; returns its observation, reward and info."""
        sim, seg = self._res.sim, self._res.seg
        assert sim is not None and seg is not None
        sends = self._send_conns()
        before = [(c.delivered, c.optimal) for c in sends]
        snap0 = {s.index: s for s in seg.connections()}
        sim.advance(self.interval)
        snap = {s.index: s for s in seg.connections()}
        rs: Dict[int, ConnRate] = {r.slot.index: r for r in rates(snap0, snap, self.interval)}
        n = self.n_conns
        done, active, lat, inflight = np.zeros((n, 2)), np.zeros((n, 2)), np.zeros((n, 2)), np.zeros((n, 2))
        state, split = np.zeros((n, 2), dtype=np.int64), np.zeros(n)
        for k, c in enumerate(sends):
            s, r = snap.get(c.slot), rs.get(c.slot)
            if s is None:
                continue
            t = s.telemetry
            state[k] = (_state(t.sout_state), _state(t.sup_state))
            inflight[k] = (t.sout_inflight_bytes, t.sup_inflight_bytes)
            split[k] = t.applied_sup_bw / SUP_BW_MAX
            if r is not None:
                done[k] = (r.sout_completed_bps, r.sup_completed_bps)
                active[k] = (r.sout_active_bps, r.sup_active_bps)
                lat[k] = (r.sout_latency_ns / 1e3, r.sup_latency_ns / 1e3)
        carried = done > 0
        peak = np.where(carried, np.maximum.reduce([self._peak * self.peak_decay, active, done]), self._peak)
        self._peak = np.where(state == 0, peak, 0.0)
        total, peak_sum = float(done.sum()), float(self._peak.sum())
        reward = min(total / peak_sum, 1.0) if peak_sum > 0 else 0.0
        moved = sum(c.delivered - b[0] for c, b in zip(sends, before))
        best = sum(c.optimal - b[1] for c, b in zip(sends, before))
        obs: Obs = {
            "completed_gbps": np.minimum(done * 8e-9, MAX_GBPS).astype(np.float32),
            "active_gbps": np.minimum(active * 8e-9, MAX_GBPS).astype(np.float32),
            "latency_us": np.minimum(lat, MAX_LATENCY_US).astype(np.float32),
            "inflight_bytes": np.minimum(inflight, MAX_INFLIGHT).astype(np.float32),
            "rail_state": state,
            "split": split.astype(np.float32),
        }
        info: Dict[str, Any] = {
            "t": sim.t,
            "step": self.steps,
            "completed_mbps": total * 8e-6,
            "peak_mbps": peak_sum * 8e-6,
            "oracle_ratio": moved / best if best > 0 else 0.0,
            "achieved_mbps": moved * 8 / self.interval / 1e6,
            "optimum_mbps": best * 8 / self.interval / 1e6,
            "optimum_split": np.array([c.optimum()[0] / SUP_BW_MAX for c in sends], dtype=np.float32),
        }
        if not math.isfinite(reward):
            reward = 0.0
        return obs, reward, info


class SplitEnv(_SimEnv):
    """``mpib/Split-v0``: one SUP fraction for every send connection,
    ``action_space = Box(0, 1, shape=(1,))``; a float or a one-number list works too. See the
    module's docstring for the observation, reward and arguments."""

    def __init__(
        self,
        scenario: Union[str, Scenario] = "2to1",
        interval: float = 0.5,
        max_steps: Optional[int] = None,
        tick: float = 0.01,
        peak_half_life: float = 5.0,
        render_mode: Optional[str] = None,
    ) -> None:
        super().__init__(scenario, interval, max_steps, tick, peak_half_life, render_mode)
        self.action_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)

    def _fractions(self, action: Action) -> "np.ndarray[Any, np.dtype[np.float64]]":
        return np.full(self.n_conns, action_fractions(action, 1)[0])


class SplitPerConnEnv(_SimEnv):
    """``mpib/SplitPerConn-v0``: one SUP fraction per send connection (the observation's rows),
    ``action_space = Box(0, 1, shape=(n,))``; a single number applies to all. See the module's
    docstring for the observation, reward and arguments."""

    def __init__(
        self,
        scenario: Union[str, Scenario] = "2to1",
        interval: float = 0.5,
        max_steps: Optional[int] = None,
        tick: float = 0.01,
        peak_half_life: float = 5.0,
        render_mode: Optional[str] = None,
    ) -> None:
        super().__init__(scenario, interval, max_steps, tick, peak_half_life, render_mode)
        self.action_space = spaces.Box(0.0, 1.0, shape=(self.n_conns,), dtype=np.float32)

    def _fractions(self, action: Action) -> "np.ndarray[Any, np.dtype[np.float64]]":
        return action_fractions(action, self.n_conns)


MIN_FRACTION = 8 / SUP_BW_MAX  # each rail keeps this share, so that both stay measured (the closed loop's 8..1016)


def active_rate_policy(obs: Obs) -> "np.ndarray[Any, np.dtype[np.float64]]":
    """A per-connection policy for :class:`SplitPerConnEnv` (the ``action_space`` shape of any
    env of this module): each connection's SUP fraction proportional to its rails' active
    rates, ``active_SUP / (active_SOUT + active_SUP)``, within [8/1024, 1016/1024] so that both
    rails stay measured; a connection whose rails did not both complete bytes in the step (a
    rail out of service, an idle step) keeps its applied split. The closed loop's target
    (:class:`mpib_agent.ClosedLoopPolicy`) without its smoothing and step limit: stateless, so
    the simulator's exact rates make it reach the optimum in one step."""
    a = np.asarray(obs["active_gbps"], dtype=np.float64)
    split = np.asarray(obs["split"], dtype=np.float64)
    total = a.sum(axis=1)
    known = (a > 0).all(axis=1)
    frac = np.where(known, a[:, 1] / np.where(known, total, 1.0), split)
    return np.clip(frac, MIN_FRACTION, 1.0 - MIN_FRACTION)


def run_episode(env: "gymnasium.Env[Obs, Any]", policy: Any, seed: Optional[int] = None) -> float:
    """Runs one episode of ``policy`` (observation -> action) from ``reset(seed=seed)`` to
    truncation; returns the ground truth over the whole episode, reset's interval included:
    the send connections' bytes over the best split's, in percent (from each step's
    ``info``)."""
    obs, info = env.reset(seed=seed)
    moved, best = info["achieved_mbps"], info["optimum_mbps"]
    while True:
        obs, _, terminated, truncated, info = env.step(policy(obs))
        moved, best = moved + info["achieved_mbps"], best + info["optimum_mbps"]
        if terminated or truncated:
            return 100.0 * moved / best if best > 0 else 0.0


IDS = {"mpib/Split-v0": "mpib_agent.gym:SplitEnv", "mpib/SplitPerConn-v0": "mpib_agent.gym:SplitPerConnEnv"}

for _id, _entry in IDS.items():
    if _id not in gymnasium.registry:
        gymnasium.register(id=_id, entry_point=_entry)

__all__ = ["IDS", "SplitEnv", "SplitPerConnEnv", "action_fractions", "active_rate_policy", "run_episode", "sup_bw"]
