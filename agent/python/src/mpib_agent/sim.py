"""A simulated MPIB plugin on a real hint segment, with a model of the two rails: for trying
and testing policies on a laptop, without NCCL or a cluster.

:class:`Simulator` creates the segment at ``path`` (or attaches to the one there) and acts as
the plugin does (docs/shm-format.md): each simulated process attaches (the shared attach
lock), registers its connections (spec 5.4: slot lease, owner word, a new ``gen``), resolves
the agent's hints for every send connection exactly as the plugin does (spec 5.3, with this
package's resolver; vanilla when no hint applies: intra-island all SUP, inter-island all
SOUT), and writes the telemetry of spec 4.3: posted bytes and requests per rail, the read
counters, ``last_sup_bw``/``last_source``/``last_read_ns``, rail states with their change
times and the failover count, and (send connections) the completion telemetry: per rail
completed bytes and requests, bytes in flight and busy time, the split applied and the wall
clock of each flush. It never beats: the heartbeat is the agent's.

Rail model, per connection: messages of ``msg_bytes`` S, one after the other, split by
w = sup_bw (parts per 1024). A rail that carries b bytes of a message takes
``latency + b*8/capacity``; the message takes the longest of those (the rails run in
parallel). Each tick multiplies the message rate by a seeded log-normal factor
``exp(noise * N(0, 1) - noise**2 / 2)``, whose mean is 1 (the message time is divided by it),
so a policy at the optimum scores 100 % on average whatever the noise; ``noise`` is at most
:data:`NOISE_MAX`. A rail that is ``down`` or ``failed`` (or has capacity 0) carries
nothing: as the plugin fails over, its share goes to the live rail whatever the hint says.
SUP does not reach another island unless the scenario declares a relay (``sup_relay``, the
plugin's MPIB_SUP_RELAY=1): an inter-island connection without one carries nothing on SUP
whatever the hint says, as the plugin's guard forces its SUP share to 0. Events change a
rail's capacity and state at given simulated times. The optimum at a moment is the best
integer split 0..1024 for the noise-free model, over the rails the connection can use.

Two clocks:

- **virtual** (:meth:`Simulator.advance`): time moves only when asked, in ticks of ``tick``
  seconds; no sleeping (tests, :mod:`mpib_agent.gym`, :func:`drive`). The segment's
  monotonic timestamps follow the virtual clock: an agent driven with it beats with
  :meth:`Simulator.mono_ns` (set :attr:`Simulator.agent` to have the ticks beat it every
  MPIB_AGENT_STALE_MS/4, as a live agent does).
- **real time** (:meth:`Simulator.run`, CLI ``mpib-agent-py sim``): simulated time follows the
  wall clock, ``speed`` times faster; timestamps are the real ``CLOCK_MONOTONIC``, so any
  agent process (Python or Go, ``run --policy closed-loop``) steers it unchanged. Rates that
  an agent measures are then ``speed`` times the simulated ones.

Scenarios (:data:`SCENARIOS`, ``mpib-agent-py sim --list``) are named rail set-ups with
events; :func:`scenario` looks one up.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ._hintcache import CachedResolver
from ._layout import RAIL_STATES, SUP_BW_MAX
from ._plugin import ConnDesc, PluginProcess
from ._policy import Policy, hint_items, rates
from ._segment import Segment, beat_period_s, create, now_ns, open_segment, stale_ns_from_env
from ._types import SegmentError

PID_BASE = 4242  # simulated process k has pid PID_BASE + k
GBIT = 1000.0  # Mbit/s
NOISE_MAX = 2.0  # the largest noise (sd of the log of the rate factor): exp stays finite


@dataclass(frozen=True)
class Rail:
    """One rail of a connection: capacity in Mbit/s, per-message latency in microseconds."""

    mbps: float
    latency_us: float = 5.0


@dataclass(frozen=True)
class Conn:
    """One simulated connection. ``process`` picks the simulated plugin process (pid
    ``PID_BASE + process``); ``conn_id`` defaults to its index in the scenario, ``peer`` to
    10.0.2.(index+2). A receive connection (``is_send=False``) reads no hints and moves its
    traffic at the vanilla split."""

    sout: Rail
    sup: Rail
    process: int = 0
    is_send: bool = True
    path_class: int = 0  # 0 intra-island (vanilla all SUP), 1 inter-island (vanilla all SOUT)
    peer: str = ""
    msg_bytes: int = 4 << 20
    conn_id: Optional[int] = None


@dataclass(frozen=True)
class Event:
    """At simulated time ``t`` (seconds), rail ``rail`` ("sout" or "sup") of connection
    ``conn`` (its index; None: every connection) takes capacity ``mbps`` and/or state
    ``state`` ("up", "down", "failed"); None leaves either unchanged."""

    t: float
    rail: str
    mbps: Optional[float] = None
    state: Optional[str] = None
    conn: Optional[int] = None


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    conns: Tuple[Conn, ...]
    events: Tuple[Event, ...] = ()
    duration: float = 30.0  # simulated seconds
    noise: float = 0.03  # sd of the log of the per-tick rate factor (mean 1); 0..NOISE_MAX
    sup_relay: bool = False  # MPIB_SUP_RELAY=1: SUP reaches other islands (else inter-island SUP carries nothing)

    def changes(self) -> List[float]:
        """The distinct event times, sorted: the phases' boundaries."""
        return sorted({e.t for e in self.events if 0 < e.t < self.duration})


def _g(x: float) -> Rail:
    return Rail(x * GBIT)


US = 1.0  # latency unit: microseconds

# The same table as the Go simulator's sim.Scenarios() (agent/go/sim/scenarios.go), whose names
# are "equal", "2:1", "4:1", "rail fails and returns", "capacity changes".
SCENARIOS: Dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("equal", "SOUT and SUP 100 Gb/s: best split 512", (Conn(_g(100), _g(100)),)),
        Scenario(
            "2to1",
            "2 processes: SUP twice SOUT (100+200 Gb/s, best ~683), SOUT twice SUP (200+100 Gb/s, "
            "best ~341), and a receive connection",
            (
                Conn(_g(100), _g(200)),
                Conn(_g(200), _g(100), process=1, conn_id=7),
                Conn(_g(100), _g(100), process=1, conn_id=8, is_send=False),
            ),
        ),
        Scenario(
            "4to1",
            "SOUT four times SUP (200 Gb/s, 20 us + 50 Gb/s, 5 us), 1 MiB messages: best ~278 (the latency counts)",
            (Conn(Rail(200 * GBIT, 20 * US), _g(50), msg_bytes=1 << 20),),
        ),
        Scenario(
            "fail",
            "SOUT 100 Gb/s, SUP 200 Gb/s; SUP goes down at 30 s (all on SOUT) and comes back at 45 s",
            (Conn(_g(100), _g(200)),),
            (Event(30, "sup", mbps=0, state="down"), Event(45, "sup", mbps=200 * GBIT, state="up")),
            duration=75,
        ),
        Scenario(
            "shift",
            "SOUT and SUP 100 Gb/s; SUP drops to 25 Gb/s at 30 s (best ~204), SOUT drops to 50 Gb/s "
            "at 60 s (best ~341)",
            (Conn(_g(100), _g(100)),),
            (Event(30, "sup", mbps=25 * GBIT), Event(60, "sout", mbps=50 * GBIT)),
            duration=90,
        ),
    )
}


def scenario(name: Union[str, Scenario]) -> Scenario:
    """The scenario named ``name``, or read from the JSON file ``name`` names (a path ending
    in ``.json`` or holding a ``/``; schema in docs/agent.md). SegmentError("bad_value")
    naming the known ones for an unknown name, SegmentError("bad_scenario") for a bad file,
    OSError for one that cannot be read."""
    if isinstance(name, Scenario):
        return name
    s = SCENARIOS.get(name)
    if s is None:
        from ._scenariofile import load_scenario, looks_like_file

        if looks_like_file(name):
            return load_scenario(name)
        raise SegmentError(
            "bad_value", f"scenario {name!r}: want one of {', '.join(SCENARIOS)} or a scenario file (NAME.json)"
        )
    return s


def msg_time(sout: Rail, sup: Rail, up: Tuple[bool, bool], msg_bytes: float, w: int) -> float:
    """Seconds a message of ``msg_bytes`` takes at split ``w`` (noise-free); inf when the split
    puts bytes on a rail that cannot carry them."""
    b_sup = msg_bytes * min(max(w, 0), SUP_BW_MAX) / SUP_BW_MAX
    t = 0.0
    for rail, b, ok in ((sout, msg_bytes - b_sup, up[0]), (sup, b_sup, up[1])):
        if b <= 0:
            continue
        if not ok or rail.mbps <= 0:
            return math.inf
        t = max(t, rail.latency_us * 1e-6 + b * 8 / (rail.mbps * 1e6))
    return t


def optimum(sout: Rail, sup: Rail, up: Tuple[bool, bool], msg_bytes: float) -> Tuple[int, float]:
    """The best split 0..1024 (lowest on ties) and its throughput in bytes/s (0: no rail)."""
    best, best_t = 0, math.inf
    for w in range(SUP_BW_MAX + 1):
        t = msg_time(sout, sup, up, msg_bytes, w)
        if t < best_t:
            best, best_t = w, t
    return best, (msg_bytes / best_t if best_t < math.inf else 0.0)


_TEL_NAMES = ("sout_bytes", "sout_requests", "sup_bytes", "sup_requests")
_DONE_NAMES = (
    "sout_completed_bytes",
    "sout_completed_requests",
    "sout_busy_ns",
    "sout_active_ns",
    "sup_completed_bytes",
    "sup_completed_requests",
    "sup_busy_ns",
    "sup_active_ns",
)


@dataclass
class SimConn:
    """A simulated connection's live state."""

    index: int
    spec: Conn
    sout: Rail
    sup: Rail
    state: List[int] = field(default_factory=lambda: [0, 0])  # sout, sup: 0 up, 1 down, 2 failed
    slot: int = -1
    gen: int = 0
    posted: List[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])  # as _TEL_NAMES
    done: List[float] = field(default_factory=lambda: [0.0] * len(_DONE_NAMES))
    inflight: List[float] = field(default_factory=lambda: [0.0, 0.0])  # bytes per rail (a gauge)
    counters: Dict[str, int] = field(default_factory=dict)  # read telemetry, written at flush
    delivered: float = 0.0  # bytes moved since start
    optimal: float = 0.0  # bytes the best split would have moved (noise-free)
    split: int = 0  # the split used in the last tick (after the guard and failover)
    sup_reaches: bool = True  # SUP reaches the peer: intra-island, or the scenario's sup_relay
    opt_cache: Optional[Tuple[Tuple[float, float, bool, bool], Tuple[int, float]]] = None

    @property
    def conn_id(self) -> int:
        return self.index if self.spec.conn_id is None else self.spec.conn_id

    @property
    def pid(self) -> int:
        return PID_BASE + self.spec.process

    def up(self) -> Tuple[bool, bool]:
        """Whether each rail (SOUT, SUP) can carry bytes now: in service, with capacity, and
        for SUP, reaching the peer (a SUP the guard keeps out counts as out of service)."""
        return (
            self.state[0] == 0 and self.sout.mbps > 0,
            self.sup_reaches and self.state[1] == 0 and self.sup.mbps > 0,
        )

    def optimum(self) -> Tuple[int, float]:
        """The best split now and its throughput in bytes/s."""
        up = self.up()
        key = (self.sout.mbps, self.sup.mbps, up[0], up[1])
        if self.opt_cache is None or self.opt_cache[0] != key:
            self.opt_cache = (key, optimum(self.sout, self.sup, up, self.spec.msg_bytes))
        return self.opt_cache[1]

    def vanilla(self) -> int:
        return SUP_BW_MAX if self.spec.path_class == 0 else 0

    def account(self, parts: Tuple[float, float], up: Tuple[bool, bool], msgs: float, slowdown: float) -> None:
        """Counts ``msgs`` messages split into ``parts`` (SOUT, SUP bytes) as the plugin's
        telemetry does: per rail the bytes and requests posted and completed, the time each
        completed request spent on the rail (its latency plus its part at the rail's capacity,
        times the tick's ``slowdown``, 1 / its rate factor), the rail's active time (the same:
        messages follow each other, so a rail has one request in flight while it carries a
        part) and the bytes in flight (one message's part while the rail carries traffic). A
        part newly in flight is posted before it completes; one that left the pipe (a smaller
        split) completed without a new post, unless its rail left service (failover: those
        bytes are lost on it)."""
        for r, (part, rail) in enumerate(zip(parts, (self.sout, self.sup))):
            inflight = part if part > 0 else 0.0
            grow = inflight - self.inflight[r]
            done = self.done[4 * r : 4 * r + 4]
            if part > 0:
                done[0] += msgs * part
                done[1] += msgs
                on_rail_ns = msgs * (rail.latency_us * 1e-6 + part * 8 / (rail.mbps * 1e6)) * slowdown * 1e9
                done[2] += on_rail_ns
                done[3] += on_rail_ns
                self.posted[2 * r] += msgs * part
                self.posted[2 * r + 1] += msgs
            if grow > 0:
                self.posted[2 * r] += grow
            elif up[r]:
                done[0] -= grow
            self.done[4 * r : 4 * r + 4] = done
            self.inflight[r] = inflight


class Simulator:
    """A simulated plugin (one or more processes) on the segment at ``path``; see the module's
    docstring. ``scenario`` is a name of :data:`SCENARIOS` or a :class:`Scenario`. When no
    file is at ``path`` it creates a segment there (``nslots``, ``npeers``). ``seed`` seeds the
    noise. Close it (or use it as a context manager) to release its slots."""

    def __init__(
        self,
        scenario_: Union[str, Scenario],
        path: str,
        *,
        seed: Optional[int] = None,
        tick: float = 0.01,
        nslots: int = 1024,
        npeers: int = 256,
        realtime: bool = False,
    ) -> None:
        self.scenario = scenario(scenario_)
        if not tick > 0:
            raise ValueError(f"tick {tick!r}: want seconds above 0")
        if not 0 <= self.scenario.noise <= NOISE_MAX:
            raise ValueError(f"scenario {self.scenario.name}: noise {self.scenario.noise!r}: want 0..{NOISE_MAX:g}")
        for e in self.scenario.events:
            if (
                e.rail not in ("sout", "sup")
                or (e.state is not None and e.state not in RAIL_STATES)
                or (e.conn is not None and not 0 <= e.conn < len(self.scenario.conns))
            ):
                raise ValueError(f"scenario {self.scenario.name}: bad event {e}")
        self.path = path
        self.tick = tick
        self.realtime = realtime
        self.rng = random.Random(seed)
        self.t = 0.0  # simulated seconds since start
        self._agent: Optional[Segment] = None
        self.created = False
        if not os.path.lexists(path):
            create(path, nslots, npeers).close()
            self.created = True
        self._mono0 = now_ns()
        self._rt0 = time.time_ns()
        self.stale_ns = stale_ns_from_env()
        self._beat_ns = int(beat_period_s(self.stale_ns) * 1e9)
        self._last_beat = -(1 << 62)  # the first virtual tick beats
        relay = self.scenario.sup_relay
        self.conns = [
            SimConn(i, c, c.sout, c.sup, sup_reaches=c.path_class == 0 or relay)
            for i, c in enumerate(self.scenario.conns)
        ]
        self.events = sorted(self.scenario.events, key=lambda e: e.t)
        self.procs: Dict[int, PluginProcess] = {}
        self.readers: Dict[int, CachedResolver] = {}  # per process: its hint reads
        self.notes: List[str] = []
        self.truth_file: Optional[str] = None  # the ground-truth file run() keeps beside the segment
        self._truth_changed = True
        self._attach()
        self._apply_events()

    # -- plumbing -----------------------------------------------------------------------------

    def _attach(self) -> None:
        """Attaches every simulated process and registers every connection."""
        procs: Dict[int, PluginProcess] = {}
        try:
            for c in self.conns:
                p = procs.get(c.spec.process)
                if p is None:
                    p = procs[c.spec.process] = PluginProcess(self.path, PID_BASE + c.spec.process)
                cid = c.index if c.spec.conn_id is None else c.spec.conn_id
                c.slot = p.register(
                    ConnDesc(
                        conn_id=cid,
                        peer_sout_ip=c.spec.peer or f"10.0.2.{c.index + 2}",
                        path_class=c.spec.path_class,
                        is_send=c.spec.is_send,
                    )
                )
                c.gen = p.slots[c.slot]
                c.posted = [0.0] * 4
                c.done = [0.0] * len(_DONE_NAMES)
                c.inflight = [0.0, 0.0]
                c.counters = {}
                for r, st in enumerate(c.state):
                    if st != 0:
                        p.set_rail_state(c.slot, ("sout", "sup")[r], st, self.realtime_ns())
        except BaseException:
            for p in procs.values():
                p.close()
            raise
        self.procs = procs
        self.readers = {k: CachedResolver(p.seg) for k, p in procs.items()}

    def close(self) -> None:
        """Releases every connection (as plugins do at close) and detaches."""
        for p in self.procs.values():
            p.close()
        self.procs = {}
        self.readers = {}
        if self.truth_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.truth_file)
            self.truth_file = None

    def __enter__(self) -> "Simulator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def agent(self) -> Optional[Segment]:
        """The agent's Segment, beaten on the virtual clock (every MPIB_AGENT_STALE_MS/4, from
        the first tick after it is set) while set."""
        return self._agent

    @agent.setter
    def agent(self, seg: Optional[Segment]) -> None:
        self._agent = seg
        self._last_beat = -(1 << 62)

    def mono_ns(self) -> int:
        """The segment's CLOCK_MONOTONIC as this simulator sees it: virtual or real."""
        return now_ns() if self.realtime else self._mono0 + int(self.t * 1e9)

    def realtime_ns(self) -> int:
        return time.time_ns() if self.realtime else self._rt0 + int(self.t * 1e9)

    def _proc(self, c: SimConn) -> PluginProcess:
        return self.procs[c.spec.process]

    def _note(self, msg: str) -> None:
        self.notes.append(f"t={self.t:.2f}s: {msg}")

    def _apply_events(self) -> None:
        while self.events and self.events[0].t <= self.t + 1e-9:
            e = self.events.pop(0)
            for c in self.conns:
                if e.conn is not None and e.conn != c.index:
                    continue
                r = 0 if e.rail == "sout" else 1
                self._truth_changed = True
                if e.mbps is not None:
                    if r == 0:
                        c.sout = replace(c.sout, mbps=e.mbps)
                    else:
                        c.sup = replace(c.sup, mbps=e.mbps)
                    self._note(f"conn {c.index} (slot {c.slot}): {e.rail} capacity {e.mbps / GBIT:g} Gb/s")
                if e.state is not None and RAIL_STATES.index(e.state) != c.state[r]:
                    c.state[r] = RAIL_STATES.index(e.state)
                    self._proc(c).set_rail_state(c.slot, e.rail, c.state[r], self.realtime_ns())
                    self._note(f"conn {c.index} (slot {c.slot}): {e.rail} {e.state}")

    # -- the model ----------------------------------------------------------------------------

    def _step(self, dt: float) -> None:
        """One tick of ``dt`` simulated seconds (the hints read at its start)."""
        self._apply_events()
        now = self.mono_ns()
        if self._agent is not None and not self.realtime and now - self._last_beat >= self._beat_ns:
            # as a live agent beats: every MPIB_AGENT_STALE_MS/4, not at every tick
            self._agent.beat(now)
            self._last_beat = now
        for c in self.conns:
            _, best = c.optimum()
            c.optimal += best * dt
            up = c.up()
            t_msg = 0.0
            w = c.vanilla()
            res = None
            if c.spec.is_send:
                res = self.readers[c.spec.process].resolve(c.slot, now, self.stale_ns)
                if res.applies:
                    w = res.sup_bw
            if up[0] != up[1]:  # the guard and failover: a rail out of service carries nothing
                w = SUP_BW_MAX if up[1] else 0
            c.split = w
            t_msg = msg_time(c.sout, c.sup, up, c.spec.msg_bytes, w)
            msgs = 0.0
            if 0 < t_msg < math.inf:
                speed = self._rate_factor()
                msgs = dt * speed / t_msg
                b_sup = c.spec.msg_bytes * w / SUP_BW_MAX
                c.account((c.spec.msg_bytes - b_sup, b_sup), up, msgs, 1.0 / speed)
                c.delivered += msgs * c.spec.msg_bytes
            if res is not None:
                PluginProcess.record_read(res, max(1, int(msgs)), now, c.counters)
        self.t += dt

    def _rate_factor(self) -> float:
        """The tick's noise: a log-normal factor on the message rate with mean exactly 1
        (E[exp(sd*Z)] = exp(sd**2/2) for Z ~ N(0, 1), hence the -sd**2/2), so that noise
        moves a score around 100 % of the noise-free optimum, never above it on average."""
        sd = self.scenario.noise
        if sd <= 0:
            return 1.0
        return math.exp(sd * self.rng.gauss(0.0, 1.0) - sd * sd / 2)

    def _flush(self) -> None:
        """Writes every connection's telemetry; a receive connection, like the plugin's,
        writes no completion telemetry."""
        for c in self.conns:
            vals = dict(c.counters)
            for name, v in zip(_TEL_NAMES, c.posted):
                vals[name] = int(v)
            if c.spec.is_send:
                for name, v in zip(_DONE_NAMES, c.done):
                    vals[name] = int(v)
                vals["sout_inflight_bytes"], vals["sup_inflight_bytes"] = int(c.inflight[0]), int(c.inflight[1])
                vals["applied_sup_bw"], vals["flush_wall_ns"] = c.split, self.realtime_ns()
            self._proc(c).put_counters(c.slot, vals)

    def advance(self, seconds: float) -> None:
        """Virtual clock: runs ``seconds`` of simulated time in ticks, then writes the
        telemetry (nobody reads it in between)."""
        end = self.t + seconds
        while self.t < end - 1e-12:
            self._step(min(self.tick, end - self.t))
        self._flush()

    # -- real time ----------------------------------------------------------------------------

    def run(
        self,
        duration: Optional[float] = None,
        *,
        speed: float = 1.0,
        stop: Optional[threading.Event] = None,
        note: Callable[[str], None] = lambda s: print(s, flush=True),
        real_tick: float = 0.005,
    ) -> None:
        """Real-time mode: simulated time follows the wall clock ``speed`` times faster, for
        ``duration`` simulated seconds (None: the scenario's duration; 0: until ``stop``),
        writing telemetry every ``real_tick`` wall-clock seconds (short, so that an agent's
        sample never misses much of an interval's bytes). A segment replaced at the path is
        followed (every connection registers there again, as the plugin's watcher does)."""
        if not speed > 0:
            raise ValueError(f"speed {speed!r}: want a number above 0")
        self.realtime = True
        stop = stop or threading.Event()
        end = self.scenario.duration if duration is None else duration
        last = time.monotonic()
        last_check = last
        while not stop.is_set() and (end == 0 or self.t < end - 1e-9):
            stop.wait(real_tick)
            now = time.monotonic()
            dt = (now - last) * speed
            last = now
            if end:
                dt = min(dt, end - self.t)
            try:
                if dt > 0:
                    self._step(dt)
                    self._flush()
                if self._truth_changed:
                    self._publish_truth_or_say(speed, note)
            except SegmentError as e:
                if e.code != "segment_gone":
                    raise
            for n in self.notes:
                note(f"sim: {n}")
            self.notes.clear()
            if now - last_check >= 0.25:
                last_check = now
                self._follow(note)

    def _publish_truth_or_say(self, speed: float, note: Callable[[str], None]) -> None:
        """publish_truth; a directory it cannot write to costs record --raw its truth, not
        the simulation (said once per change)."""
        try:
            self.publish_truth(speed)
        except OSError as e:
            self._truth_changed = False
            note(f"sim: ground truth not published beside the segment ({e}): record --raw writes no truth")

    def _follow(self, note: Callable[[str], None]) -> None:
        """Re-registers every connection on a segment that replaced the attached one."""
        p = next(iter(self.procs.values()), None)
        if p is None or not p.seg.replaced():
            return
        try:
            open_segment(self.path).close()  # validates; else keep the old one
        except (SegmentError, OSError):
            return
        old, self.procs = self.procs, {}
        for q in old.values():
            q.close()
        self._attach()
        self._truth_changed = True
        note(
            f"sim: segment {self.path} replaced: connections registered again "
            f"(slots {', '.join(str(c.slot) for c in self.conns)})"
        )

    # -- reading the model --------------------------------------------------------------------

    def truth(self, speed: float = 1.0) -> List[Dict[str, Any]]:
        """The ground truth now, per connection (in the scenario's order): its ``slot`` and
        ``gen``, each rail's capacity (``sout_mbps``, ``sup_mbps``) and state, and the best
        split with its throughput (``opt_sup_bw``, ``opt_mbps``). Rates are Mbit/s times
        ``speed``: what an agent measures when simulated time runs ``speed`` times faster."""
        out = []
        for c in self.conns:
            w, best = c.optimum()
            out.append(
                {
                    "slot": c.slot,
                    "gen": c.gen,
                    "is_send": c.spec.is_send,
                    "sout_mbps": c.sout.mbps * speed,
                    "sup_mbps": c.sup.mbps * speed,
                    "sout_state": RAIL_STATES[c.state[0]],
                    "sup_state": RAIL_STATES[c.state[1]],
                    "opt_sup_bw": w,
                    "opt_mbps": best * 8e-6 * speed,
                }
            )
        return out

    def publish_truth(self, speed: float = 1.0) -> None:
        """Writes the ground truth to :func:`truth_path` (atomically; removed by ``close``), so
        that ``record --raw`` in another process puts it on each record. Real-time mode does
        it at start and after each change."""
        dest = truth_path(self.path)
        doc = {
            "pid": os.getpid(),
            "scenario": self.scenario.name,
            "speed": speed,
            "t": self.t,
            "conns": self.truth(speed),
        }
        tmp = f"{dest}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, dest)
        self.truth_file = dest
        self._truth_changed = False

    def summary(self) -> List[str]:
        out = []
        for c in self.conns:
            ratio = c.delivered / c.optimal if c.optimal > 0 else 0.0
            kind = "send" if c.spec.is_send else "recv (vanilla)"
            out.append(
                f"conn {c.index} (slot {c.slot}, {c.pid}:{c.conn_id}, {kind}): "
                f"{c.delivered * 8 / max(self.t, 1e-9) / 1e9:.1f} Gb/s on average, "
                f"{100 * ratio:.1f}% of the optimum"
            )
        return out


def drive(
    sim: Simulator,
    policy: Policy,
    interval: float,
    duration: float,
    on_interval: Optional[Callable[[Simulator], None]] = None,
) -> None:
    """Runs ``policy`` (a :func:`mpib_agent.run_policy` callback, e.g.
    :class:`~mpib_agent.ClosedLoopPolicy`) against ``sim`` on the virtual clock: an agent
    Segment of its own that beats at every tick, the policy called with each interval's rates
    and its hints written for the gen they were computed on, as ``run_policy`` does in real
    time. ``on_interval`` is called after each interval."""
    with open_segment(sim.path) as seg:
        seg.acquire_agent()
        sim.agent = seg
        try:
            prev = {s.index: s for s in seg.connections()}
            end = sim.t + duration
            while sim.t < end - 1e-9:
                sim.advance(min(interval, end - sim.t))
                cur = {s.index: s for s in seg.connections()}
                for slot, bw in hint_items(policy(rates(prev, cur, interval))):
                    c = cur.get(slot)
                    if c is not None:
                        try:
                            seg.set_slot_hint(slot, bw, gen=c.gen)
                        except SegmentError as e:
                            if e.code not in ("slot_inactive", "gen_changed"):
                                raise
                prev = cur
                if on_interval is not None:
                    on_interval(sim)
        finally:
            sim.agent = None
            seg.release_agent()


def truth_path(path: str) -> str:
    """Where a real-time simulator on the segment at ``path`` keeps its ground truth."""
    return path + ".truth.json"


def read_truth(path: str) -> Dict[Tuple[int, int], Dict[str, Any]]:
    """The ground truth a live simulator publishes for the segment at ``path``, by
    ``(slot, gen)``; empty when no simulator drives it (no file, or its process is gone)."""
    try:
        with open(truth_path(path), encoding="utf-8") as fh:
            doc = json.load(fh)
        os.kill(int(doc["pid"]), 0)
        return {(int(c["slot"]), int(c["gen"])): c for c in doc["conns"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def describe() -> List[str]:
    """One line per scenario (the CLI's ``sim --list``)."""
    return [f"{s.name:<6} {s.duration:>3g} s  {s.description}" for s in SCENARIOS.values()]


__all__ = [
    "Conn",
    "Event",
    "Rail",
    "Scenario",
    "SCENARIOS",
    "SimConn",
    "Simulator",
    "describe",
    "drive",
    "msg_time",
    "optimum",
    "read_truth",
    "scenario",
    "truth_path",
    "PID_BASE",
]
