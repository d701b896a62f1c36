"""mpib-agent-py's Python-only commands, on the simulator's clock or a file: sim, replay,
evaluate and plot. Their modules (sim, trace, evaluate, plot) are imported when the command
runs: the CLI starts without them, and plot's error names the extra to install."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ._cli_args import PROG, UsageError, _duration_s, _int, _seed, _speed, _stop_on_signals, _warn
from ._segment import liveness
from ._types import SegmentError

if TYPE_CHECKING:
    from .sim import Scenario


def _scenario(name: str) -> "Scenario":
    """--scenario NAME or FILE.json: a wrong name or a bad file is a usage error."""
    from . import sim

    try:
        return sim.scenario(name)
    except SegmentError as e:
        raise UsageError(f"--scenario: {e.detail}") from None
    except OSError as e:
        raise UsageError(f"--scenario {name!r}: cannot read it: {e.strerror or e}") from None


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
    try:
        specs = evaluate.policy_specs(a.policy)
    except ValueError as e:
        raise UsageError(f"--policy: {e}") from None
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
