"""mpib-agent-py: the Python agent's command line.

The segment commands (create, list, set, top, record, heartbeat, run, gc) take the same flags,
print the same output and exit as the Go ``mpib-agent`` (TestCLIsAgree in
agent/go/cmd/mpib-agent runs both on one segment): 0 done, 1 the operation failed (stderr:
"mpib-agent-py CMD: CODE: message", CODE shared with the Go agent), 2 the command line is
wrong. Python only: ``sim``, ``replay``, ``evaluate``, ``plot`` and ``record --raw``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from dataclasses import asdict
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    NoReturn,
    Optional,
    Sequence,
    Tuple,
)

from . import __version__
from ._closedloop import MAX_STEP, ClosedLoopPolicy
from ._layout import MAX_PEERS, MAX_SLOTS, total_size
from ._policy import (
    ConnRate,
    Proportional,
    StaticWeights,
    agent_loop,
    gone,
    parse_conn,
    parse_peer,
    rate_sampler,
    rates,
    signal_setter,
)
from ._resolve import clamp, heartbeat_fresh
from ._segment import (
    Segment,
    beat_period_s,
    create,
    default_path,
    liveness,
    now_ns,
    open_segment,
    parse_class,
    stale_ns_from_env,
)
from ._types import SegmentError, Slot, Snapshot, class_name, sup_path_name
from ._watch import CSVWriter, sample, watch, write_jsonl

if TYPE_CHECKING:
    from .sim import Scenario

PROG = "mpib-agent-py"


class UsageError(Exception):
    """A wrong command line (exit 2)."""


def _warn(msg: object) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr, flush=True)


def _status(seg: Segment) -> str:
    h = seg.header()
    if h.heartbeat_ns == 0:
        return "agent: none (hints do not apply; plugins use the vanilla policy)"
    now = now_ns()
    age = int((now - h.heartbeat_ns) / 1e6)
    ok = heartbeat_fresh(h.heartbeat_ns, now, stale_ns_from_env())
    state = "alive" if ok else "STALE (plugins use the vanilla policy)"
    return f"agent: pid {h.agent_pid}, last beat {age} ms ago, {state}"


_DUR_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)?$")
_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, None: 1e9, "m": 60e9, "h": 3600e9}
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_UINT_RE = re.compile(r"^[0-9]+$")
_NUM_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")


def _duration_s(flag: str, s: str) -> float:
    """Seconds (0.5) or a number with a unit (500ms, 2s, 1m); > 0. Returns seconds."""
    m = _DUR_RE.match(s)
    if m is None:
        raise UsageError(f"--{flag} {s!r}: want seconds (0.5) or a number with a unit (500ms, 2s, 1m)")
    ns = math.floor(float(m.group(1)) * _UNITS[m.group(2)] + 0.5)
    if ns < 1 or ns > (1 << 62):
        raise UsageError(f"--{flag} {s!r}: must be above 0")
    return ns / 1e9


def _fmt_ms(seconds: float) -> str:
    """A duration the way both CLIs print it: milliseconds, up to 3 decimals."""
    us = math.floor(seconds * 1e6 + 0.5)
    return f"{us / 1e3:.3f}".rstrip("0").rstrip(".") + " ms"


def _int(flag: str, s: str) -> int:
    if _INT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--{flag} {s!r}: want an integer")
    return int(s)


def _sup_bw(s: str) -> int:
    if _UINT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--sup-bw {s!r}: want an integer 0..1024 (larger values are clamped)")
    return min(int(s), 0xFFFFFFFF)


def _capacity(v: str) -> Tuple[float, float]:
    """sout=X,sup=Y (either or both; X, Y >= 0)."""
    caps: Dict[str, float] = {}
    if v == "":
        return 0.0, 0.0
    for kv in v.split(","):
        k, sep, val = kv.partition("=")
        if not sep or _NUM_RE.match(val) is None or not val.isascii():
            raise UsageError(f"--capacity {v!r}: want sout=X,sup=Y with numbers >= 0")
        if k in caps:
            raise UsageError(f"--capacity {v!r}: rail {k!r} given twice")
        if k not in ("sout", "sup"):
            raise UsageError(f"--capacity {v!r}: unknown rail {k!r} (sout, sup)")
        caps[k] = float(val)
    return caps.get("sout", 0.0), caps.get("sup", 0.0)


MAX_DEV = 0xFFFF  # dev is a u16 (the plugin writes 0..15)


def _devs(values: Optional[List[str]]) -> Optional[FrozenSet[int]]:
    """--dev N, repeatable, each a comma list (--dev 0,1 --dev 3): the devices whose
    connections to keep; None (no --dev): all."""
    if not values:
        return None
    out = set()
    for v in values:
        for d in v.split(","):
            if _UINT_RE.match(d) is None or not d.isascii() or int(d) > MAX_DEV:
                raise UsageError(
                    f"--dev {v!r}: want device indexes 0..{MAX_DEV}, comma-separated (--dev 0,1) "
                    "or repeated (--dev 0 --dev 1)"
                )
            out.add(int(d))
    return frozenset(out)


def _only(devs: Optional[FrozenSet[int]], slots: Iterable[Slot]) -> List[Slot]:
    """The connections of ``devs`` (all when None)."""
    return [s for s in slots if devs is None or s.dev in devs]


def _only_sample(devs: Optional[FrozenSet[int]], smp: Dict[str, Any]) -> Dict[str, Any]:
    """A telemetry sample (``_watch.sample``) with the connections of ``devs`` only."""
    if devs is None:
        return smp
    return dict(smp, conns=[c for c in smp["conns"] if c["dev"] in devs])


# ---- commands -----------------------------------------------------------------------------


def _cmd_create(a: argparse.Namespace) -> int:
    slots, peers = _int("slots", a.slots), _int("peers", a.peers)
    if not 1 <= slots <= MAX_SLOTS or not 0 <= peers <= MAX_PEERS:
        raise SegmentError("bad_geometry", f"--slots {slots} (1..{MAX_SLOTS}) --peers {peers} (0..{MAX_PEERS})", a.path)
    with create(a.path, slots, peers, force=a.force):
        print(f"created {a.path}: {slots} slots, {peers} peers, {total_size(slots, peers)} bytes, mode 0600")
    return 0


_LIST_FMT = "{:>5} {:>3} {:>21} {:>15} {:>15} {:>7} {:>4} {:>5} {:>5} {:>8} {:>14} {:>14} {:>13} {:>9} {:>8} {}"


def _nic_pair(c: Slot) -> str:
    """A connection's NICs as ``list`` shows them: SOUT/SUP, ``-`` for a name not given, the
    port when it is not 1 (the Go CLI's nicPair)."""

    def one(name: str, port: int) -> str:
        return (name or "-") + (f":{port}" if port > 1 else "")

    return one(c.sout_nic, c.sout_port) + "/" + one(c.sup_nic, c.sup_port)


def _cmd_list(a: argparse.Namespace) -> int:
    devs = _devs(a.dev)
    with open_segment(a.path) as seg:
        conns = _only(devs, seg.connections())
        now, stale = now_ns(), stale_ns_from_env()
        rows = [(c, seg.resolve(c.index, now, stale)) for c in conns]
        if a.json:
            print(json.dumps([dict(asdict(c), effective=asdict(r)) for c, r in rows], indent=2))
            return 0
        print(_status(seg))
        print(
            _LIST_FMT.format(
                "SLOT",
                "DEV",
                "PID:CONN",
                "LOCAL",
                "PEER",
                "CLASS",
                "DIR",
                "QPS",
                "HINT",
                "SOURCE",
                "SOUT_BYTES",
                "SUP_BYTES",
                "RAILS",
                "FAILOVERS",
                "SUP_PATH",
                "NICS",
            )
        )
        for c, r in rows:
            print(
                _LIST_FMT.format(
                    c.index,
                    c.dev,
                    f"{c.pid}:{c.conn_id}",
                    c.local_sout_ip,
                    c.peer_sout_ip,
                    class_name(c.path_class),
                    "send" if c.is_send == 1 else "recv",
                    f"{c.nqps_sout}+{c.nqps_sup}",
                    r.sup_bw if r.applies else "-",
                    r.source,
                    c.telemetry.sout_bytes,
                    c.telemetry.sup_bytes,
                    f"{c.telemetry.sout_state}/{c.telemetry.sup_state}",
                    c.telemetry.failovers,
                    sup_path_name(c.sup_path),
                    _nic_pair(c),
                )
            )
        print(_hint_tables(seg.snapshot()))
    return 0


def _hint_tables(snap: Snapshot) -> str:
    """list's last line: the class and peer defaults as set, whether or not a connection uses
    them now (the Go CLI's hintTables)."""
    parts = [f"class {class_name(c)}={r.sup_bw}" for c, r in enumerate(snap.class_defaults) if r.valid]
    parts += [f"peer {p.record.peer_ip}/{p.record.prefix_len}={p.record.sup_bw}" for p in snap.peers if p.record.valid]
    return "defaults: " + (" ".join(parts) if parts else "none")


def _cmd_set(a: argparse.Namespace) -> int:
    if sum(x is not None for x in (a.conn, a.peer, a.cls)) != 1:
        raise UsageError("give exactly one of --conn, --peer, --class")
    if a.clear == (a.sup_bw is not None):
        raise UsageError("give either --sup-bw N or --clear")
    if a.gen is not None and a.conn is None:
        raise UsageError("--gen goes with --conn")
    bw: Optional[int] = None if a.clear else _sup_bw(a.sup_bw)
    try:
        if a.conn is not None:
            sel = parse_conn(a.conn)
            if a.gen is not None and (_UINT_RE.match(a.gen) is None or int(a.gen) >= 1 << 32):
                raise UsageError(f"--gen {a.gen!r}: want an integer below 2^32")
        elif a.peer is not None:
            ip, plen = parse_peer(a.peer)
        else:
            cls = parse_class(a.cls)
    except SegmentError as e:
        flag = "conn" if a.conn is not None else "peer" if a.peer is not None else "class"
        raise UsageError(f"--{flag}: {e.detail}") from None
    with open_segment(a.path) as seg:
        if a.conn is not None:
            c = sel.find(seg.connections())
            if c is None:
                raise SegmentError("slot_inactive", f"connection {a.conn}: no active connection", seg.path)
            gen = int(a.gen) if a.gen is not None else c.gen
            v, what = seg.set_slot_hint(c.index, bw, gen=gen), f"slot {c.index} (gen {gen})"
        elif a.peer is not None:
            v, what = seg.set_peer_hint(ip, bw, prefix_len=plen), f"peer {ip}/{plen}"
        else:
            v, what = seg.set_class_hint(cls, bw), f"class {class_name(cls)}"
        print(f"{what}: cleared" if bw is None else f"{what}: sup_bw={v}")
        if not seg.agent_alive():
            _warn("no live agent heartbeat: the hint applies once `heartbeat` or `run` is running")
    return 0


_TOP_FMT = "{:>5} {:>3} {:>15} {:>7} {:>5} {:>8} {:>10} {:>10} {:>9}"


def _frame(seg: Segment, rs: List[ConnRate], now: int, clear: bool) -> None:
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    print(f"{PROG} top  {seg.path}  {_status(seg)}")
    print(_TOP_FMT.format("SLOT", "DEV", "PEER", "CLASS", "HINT", "SOURCE", "SOUT Gb/s", "SUP Gb/s", "SUP share"))
    ts = tp = 0.0
    per_dev: Dict[int, Tuple[float, float]] = {}
    for r in rs:
        res = seg.resolve(r.slot.index, now)
        ts, tp = ts + r.sout_bps, tp + r.sup_bps
        d = per_dev.get(r.slot.dev, (0.0, 0.0))
        per_dev[r.slot.dev] = (d[0] + r.sout_bps, d[1] + r.sup_bps)
        print(
            _TOP_FMT.format(
                r.slot.index,
                r.slot.dev,
                r.slot.peer_sout_ip,
                class_name(r.slot.path_class),
                res.sup_bw if res.applies else "-",
                res.source,
                f"{r.sout_bps * 8e-9:.2f}",
                f"{r.sup_bps * 8e-9:.2f}",
                f"{r.sup_share:.3f}",
            )
        )
    if len(per_dev) > 1:  # per device and rail
        for dev in sorted(per_dev):
            so, su = per_dev[dev]
            sh = su / (so + su) if so + su > 0 else 0.0
            print(_TOP_FMT.format("dev", dev, "", "", "", "", f"{so * 8e-9:.2f}", f"{su * 8e-9:.2f}", f"{sh:.3f}"))
    share = tp / (ts + tp) if ts + tp > 0 else 0.0
    print(_TOP_FMT.format("total", "", "", "", "", "", f"{ts * 8e-9:.2f}", f"{tp * 8e-9:.2f}", f"{share:.3f}"))
    sys.stdout.flush()


def _cmd_top(a: argparse.Namespace) -> int:
    interval = _duration_s("interval", a.interval)
    count = _int("count", a.count)
    if count < 0:
        raise UsageError(f"--count {count}: want 0 (forever) or more")
    devs = _devs(a.dev)
    with open_segment(a.path) as seg:
        prev, prev_t = {s.index: s for s in _only(devs, seg.connections())}, now_ns()
        i = 0
        try:
            while count == 0 or i < count:
                time.sleep(interval)
                cur_t = now_ns()
                cur = {s.index: s for s in _only(devs, seg.connections())}
                if a.json:
                    write_jsonl(sys.stdout, sample(prev, cur, (cur_t - prev_t) / 1e9))
                else:
                    _frame(seg, rates(prev, cur, (cur_t - prev_t) / 1e9), cur_t, not a.plain)
                prev, prev_t, i = cur, cur_t, i + 1
        except KeyboardInterrupt:
            pass
    return 0


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event that SIGINT and SIGTERM set while the block runs (then the old handlers)."""
    stop = threading.Event()
    old = {sig: signal.signal(sig, signal_setter(stop)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _cmd_record(a: argparse.Namespace) -> int:
    interval = _duration_s("interval", a.interval)
    count = _int("count", a.count)
    if count < 0:
        raise UsageError(f"--count {count}: want 0 (until stopped) or more")
    if a.format not in ("jsonl", "csv"):
        raise UsageError(f"--format {a.format!r}: want jsonl or csv")
    if a.raw and a.format != "jsonl":
        raise UsageError("--raw writes jsonl (each connection's counters are nested objects)")
    devs = _devs(a.dev)
    open_segment(a.path).close()  # refuse a bad segment before creating the output
    n = 0
    with _stop_on_signals() as stop, open(a.out, "w", encoding="utf-8", newline="") as out:
        cw = CSVWriter(out) if a.format == "csv" else None
        for s in watch(a.path, interval, count=count or None, stop=stop, raw=a.raw):
            s = _only_sample(devs, s)
            if cw is not None:
                cw.write(s)
            else:
                write_jsonl(out, s)
            n += 1
    print(f"record: {n} sample(s) written to {a.out}", file=sys.stderr)
    return 0


def _scenario(name: str) -> "Scenario":
    """--scenario NAME or FILE.json: a wrong name or a bad file is a usage error."""
    from . import sim

    try:
        return sim.scenario(name)
    except SegmentError as e:
        raise UsageError(f"--scenario: {e.detail}") from None
    except OSError as e:
        raise UsageError(f"--scenario {name!r}: cannot read it: {e.strerror or e}") from None


def _seed(s: Optional[str], default: Optional[int]) -> Optional[int]:
    if s is None:
        return default
    if _UINT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--seed {s!r}: want an integer >= 0")
    return int(s)


def _speed(s: str) -> float:
    if _NUM_RE.match(s) is None or not s.isascii() or float(s) <= 0 or float(s) > 1e6:
        raise UsageError(f"--speed {s!r}: want a number above 0 (1 = real time, 10 = ten times faster)")
    return float(s)


def _cmd_sim(a: argparse.Namespace) -> int:
    from . import sim

    if a.list:
        for line in sim.describe():
            print(line)
        return 0
    if a.scenario is None:
        raise UsageError("give --scenario NAME or FILE.json (--list shows the names)")
    sc = _scenario(a.scenario)
    speed = _speed(a.speed)
    duration = sc.duration
    if a.duration is not None:
        duration = 0.0 if a.duration == "0" else _duration_s("duration", a.duration)
    seed = _seed(a.seed, None)
    lv = liveness(a.path)
    if lv.locked:
        _warn(f"{a.path} is in use ({lv}): the simulated connections join the ones there")
    with _stop_on_signals() as stop, sim.Simulator(sc, a.path, seed=seed, realtime=True) as sm:
        made = "created" if sm.created else "attached to"
        print(f"sim: scenario {sc.name}: {sc.description}", flush=True)
        until = "until stopped" if duration == 0 else f"{duration:g} s simulated ({duration / speed:g} s)"
        print(f"sim: {made} {a.path}; speed {speed:g}x; {until}", flush=True)
        for c in sm.conns:
            print(
                f"sim: conn {c.index}: slot {c.slot} gen {c.gen} pid:conn_id {c.pid}:{c.conn_id} "
                f"{'send' if c.spec.is_send else 'recv'} SOUT {c.sout.mbps / 1000:g} Gb/s, "
                f"SUP {c.sup.mbps / 1000:g} Gb/s; best split {c.optimum()[0]}",
                flush=True,
            )
        sm.run(duration, speed=speed, stop=stop)
        for line in sm.summary():
            print(f"sim: {line}", flush=True)
    return 0


def _policy_spec(spec: str) -> str:
    from . import evaluate

    try:
        return evaluate.policy_factory(spec)[0]
    except ValueError as e:
        raise UsageError(f"--policy: {e}") from None


def _cmd_replay(a: argparse.Namespace) -> int:
    from . import trace
    from .evaluate import policy_factory

    name = _policy_spec(a.policy)
    interval = _duration_s("interval", a.interval)
    seed = _seed(a.seed, 1)
    assert seed is not None
    sc = trace.trace_scenario(trace.read_trace(a.trace))
    policy = policy_factory(a.policy)[1]()
    if a.record:
        with open(a.record, "w", encoding="utf-8") as out:
            pct = trace.simulate(sc, policy, seed, interval, record=out)
    else:
        pct = trace.simulate(sc, policy, seed, interval)
    print(f"replay: trace={a.trace} policy={name} pct={pct:.1f}")
    return 0


def _cmd_evaluate(a: argparse.Namespace) -> int:
    from . import evaluate

    seeds = _int("seeds", a.seeds)
    if seeds < 1:
        raise UsageError(f"--seeds {seeds}: want 1 or more")
    jobs = _int("jobs", a.jobs) if a.jobs is not None else None
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs {jobs}: want 1 or more")
    specs = evaluate.policy_specs(a.policy)
    for p in specs:
        _policy_spec(p)
    try:
        scs = evaluate.scenario_specs(a.scenarios)
    except SegmentError as e:
        raise UsageError(f"--scenarios: {e.detail}") from None
    except OSError as e:
        raise UsageError(f"--scenarios: cannot read {e.filename}: {e.strerror or e}") from None
    rs = evaluate.evaluate(specs, scs, seeds, interval=_duration_s("interval", a.interval), jobs=jobs)
    print(f"percent of the optimum, mean over seeds 1..{seeds}:")
    for line in evaluate.table(rs):
        print(line)
    for r in rs:
        print(r.line())
    return 0


def _cmd_plot(a: argparse.Namespace) -> int:
    from .plot import plot  # matplotlib is imported when drawing, so that the error says what to install

    try:
        plot(a.trace, a.out)
    except ImportError as e:
        print(f"{PROG} plot: missing_extra: {e}", file=sys.stderr)
        return 1
    print(f"plot: {a.trace} -> {a.out}")
    return 0


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

    def tick() -> None:
        for n in p.tick(seg, seg.connections()):
            print(n, flush=True)

    return tick


def _proportional_tick(seg: Segment, p: Proportional) -> Callable[[], None]:
    state: Dict[str, object] = {"prev": {s.index: s for s in seg.connections()}, "t": now_ns()}
    last: Dict[int, Tuple[int, int]] = {}

    def tick() -> None:
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

    def tick() -> None:
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
        n = [0]

        def with_gc() -> None:
            tick()
            n[0] += 1
            if n[0] % 5 == 0:
                seg.gc()

        _loop(seg, with_gc, interval)
    return 0


def _cmd_gc(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        freed = seg.gc()
        print(f"reclaimed {len(freed)} slot(s)" + (":" + "".join(f" {i}" for i in freed) if freed else ""))
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: usage: {message}\n")


def _parser() -> Tuple[argparse.ArgumentParser, Dict[str, argparse.ArgumentParser]]:
    ap = _Parser(prog=PROG, description="MPIB hint segment agent (Python)", allow_abbrev=False)
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    subs: Dict[str, argparse.ArgumentParser] = {}

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument("--path", default=default_path(), help="segment file")
        subs[name] = p
        return p

    def dev_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dev",
            action="append",
            metavar="N[,N...]",
            help="only the connections of these fused devices (the plugin's device index, "
            "0..65535): a comma list, or the flag repeated; default all",
        )

    p = cmd("create", "create the segment (mode 0600)")
    p.add_argument("--slots", default="1024")
    p.add_argument("--peers", default="256")
    p.add_argument("--force", action="store_true", help="replace a segment even while in use")
    p.set_defaults(fn=_cmd_create)
    p = cmd("list", "list connections and their hints")
    p.add_argument("--json", action="store_true")
    dev_flag(p)
    p.set_defaults(fn=_cmd_list)
    p = cmd("set", "set or clear a hint")
    p.add_argument("--conn", help="SLOT or PID:CONN_ID")
    p.add_argument("--gen", help="with --conn: the slot generation the hint is for (default: the one found now)")
    p.add_argument("--peer", help="IP or IP/LEN")
    p.add_argument("--class", dest="cls", help="intra or inter")
    p.add_argument("--sup-bw", help="parts per 1024 (0 all SOUT .. 1024 all SUP)")
    p.add_argument("--clear", action="store_true")
    p.set_defaults(fn=_cmd_set)
    p = cmd("top", "live per-rail throughput")
    p.add_argument("--interval", default="1")
    p.add_argument("--count", default="0")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON sample per line per interval")
    dev_flag(p)
    p.set_defaults(fn=_cmd_top)
    p = cmd("record", "write telemetry samples to a file")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--format", default="jsonl", help="jsonl | csv")
    p.add_argument("--interval", default="1")
    p.add_argument("--count", default="0", help="samples (0: until stopped)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="jsonl only (Python only): each connection also carries every telemetry counter (raw) and, "
        "when `sim` drives the segment, its ground truth (truth)",
    )
    dev_flag(p)
    p.set_defaults(fn=_cmd_record)
    p = cmd("sim", "simulated plugin with a rail model (for trying policies)")
    p.add_argument("--scenario", help="scenario name (--list shows them) or a scenario file, FILE.json")
    p.add_argument("--duration", help="simulated time (default: the scenario's; 0: until stopped)")
    p.add_argument("--speed", default="1", help="simulated seconds per real second")
    p.add_argument("--seed", help="noise seed")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.set_defaults(fn=_cmd_sim)
    for name in ("heartbeat", "daemon"):
        cmd(name, "beat until stopped").set_defaults(fn=_cmd_heartbeat)
    p = cmd("run", "policy loop with heartbeat")
    p.add_argument("--policy", default="static", help="static | proportional | closed-loop")
    p.add_argument("--file", help="static: weights JSON (re-read when it changes)")
    p.add_argument("--capacity", default="", help="proportional: sout=X,sup=Y")
    p.add_argument(
        "--step", help="closed-loop: largest move of the split per interval, parts per 1024 (1..256, default 64)"
    )
    p.add_argument("--interval", help="default 1 (closed-loop: 0.5)")
    p.set_defaults(fn=_cmd_run)
    cmd("gc", "reclaim slots of dead processes").set_defaults(fn=_cmd_gc)
    _offline_commands(sub, subs)
    return ap, subs


def _offline_commands(sub: Any, subs: Dict[str, argparse.ArgumentParser]) -> None:
    """replay, evaluate, plot: Python only, on the simulator's virtual clock or a file (no
    segment, hence no --path)."""
    p = sub.add_parser(
        "replay", help="drive the simulator from a capacity trace, print the percent of the optimum", allow_abbrev=False
    )
    p.add_argument("trace", help="trace file (JSON Lines; docs/agent.md, Traces)")
    p.add_argument("--policy", default="closed-loop", help="vanilla | proportional | closed-loop | module:function")
    p.add_argument("--seed", help="noise seed (default 1)")
    p.add_argument("--interval", default="0.5", help="policy interval, simulated (default 0.5)")
    p.add_argument("--record", metavar="FILE", help="also write the replayed run as a trace (for plot)")
    p.set_defaults(fn=_cmd_replay)
    subs["replay"] = p
    p = sub.add_parser(
        "evaluate", help="percent of the optimum per policy and scenario, over seeds", allow_abbrev=False
    )
    p.add_argument(
        "--policy",
        default="all",
        help="all | NAME[,NAME] | module:function (built-in: vanilla, proportional, closed-loop)",
    )
    p.add_argument("--scenarios", default="all", help="all | NAME[,NAME] | FILE.json (comma list)")
    p.add_argument("--seeds", default="5", help="seeds 1..N per scenario (default 5)")
    p.add_argument("--interval", default="0.5", help="policy interval, simulated (default 0.5)")
    p.add_argument("--jobs", help="processes (default: the CPU count)")
    p.set_defaults(fn=_cmd_evaluate)
    subs["evaluate"] = p
    p = sub.add_parser(
        "plot", help="draw rates, split and rail states of a trace (needs mpib-agent[plot])", allow_abbrev=False
    )
    p.add_argument("trace", help="trace file (record --raw, replay --record, or hand-written)")
    p.add_argument("-o", "--out", required=True, help="output PNG")
    p.set_defaults(fn=_cmd_plot)
    subs["plot"] = p


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap, subs = _parser()
    a, extra = ap.parse_known_args(argv)
    if extra:
        subs[a.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, *_a, **_k: _warn(m)
        try:
            rc: int = a.fn(a)
            return rc
        except UsageError as e:
            print(f"{PROG} {a.cmd}: usage: {e}", file=sys.stderr)
            return 2
        except SegmentError as e:
            print(f"{PROG} {a.cmd}: {e.code}: {e}", file=sys.stderr)
            return 1
        except (OSError, ValueError) as e:
            print(f"{PROG} {a.cmd}: io: {e}", file=sys.stderr)
            return 1
