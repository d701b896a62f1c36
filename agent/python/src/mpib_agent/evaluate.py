"""Scoring split policies on the simulator: percent of the optimum per scenario, over seeds
(``mpib-agent-py evaluate``; docs/agent.md, "Evaluating policies").

A policy is a :func:`mpib_agent.run_policy` callback (rates in, ``{slot: sup_bw}`` or None
out), named by a built-in name (:data:`BUILTIN`) or ``module:NAME``. ``NAME`` may be a class
(instantiated once per run, so each scenario and seed starts with a fresh state) or any other
callable (used as it is). Each run drives the scenario's whole duration on the virtual clock,
on a segment of its own, and scores the send connections' bytes over what the best split
would have moved (noise-free), start and re-convergence included.
"""

from __future__ import annotations

import importlib
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ._closedloop import ClosedLoopPolicy
from ._layout import SUP_BW_MAX
from ._policy import ConnRate, Policy, Proportional
from ._types import SegmentError
from .sim import SCENARIOS, Scenario, scenario
from .trace import simulate

PolicyFactory = Callable[[], Policy]


def vanilla() -> Policy:
    """No hints: the simulated plugin applies its vanilla split (intra-island all SUP)."""
    return lambda rates: None


class ProportionalPolicy:
    """``run --policy proportional`` without ``--capacity``: every send connection at
    ``1024 * P_sup / (P_sout + P_sup)``, P each rail's decaying peak of the node's posted
    throughput (one split for the whole node)."""

    def __init__(self) -> None:
        self.p = Proportional()

    def __call__(self, rates: List[ConnRate]) -> Dict[int, int]:
        self.p.observe(rates)
        bw = min(self.p.sup_bw(), SUP_BW_MAX)
        return {r.slot.index: bw for r in rates if r.slot.is_send == 1}


BUILTIN: Dict[str, PolicyFactory] = {
    "vanilla": vanilla,
    "proportional": ProportionalPolicy,
    "closed-loop": ClosedLoopPolicy,
}
ALIASES = {"closed_loop": "closed-loop", "closedloop": "closed-loop", "none": "vanilla"}


def policy_factory(spec: str) -> Tuple[str, PolicyFactory]:
    """(name, factory) for a built-in name (or alias) or ``module:NAME``; ValueError saying
    what is wrong otherwise. ``module`` is imported from ``sys.path`` with the current
    directory added at its end when it is not there: ``python -m mpib_agent`` has it first,
    the ``mpib-agent-py`` console script does not (its sys.path[0] is the script's directory),
    and worker processes call this too."""
    name = ALIASES.get(spec, spec)
    if name in BUILTIN:
        return name, BUILTIN[name]
    mod, sep, attr = spec.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"policy {spec!r}: want one of {', '.join(BUILTIN)}, all, or module:function")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)
    try:
        obj = getattr(importlib.import_module(mod), attr)
    except ImportError as e:
        raise ValueError(f"policy {spec!r}: cannot import {mod!r}: {e}") from None
    except AttributeError:
        raise ValueError(f"policy {spec!r}: module {mod!r} has no {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"policy {spec!r}: {attr!r} is not callable")
    if isinstance(obj, type):
        return spec, obj
    return spec, lambda: obj


def policy_specs(spec: str) -> List[str]:
    """``all`` (the built-in policies) or a comma list; ValueError when it names none."""
    specs = list(BUILTIN) if spec == "all" else [p for p in spec.split(",") if p]
    if not specs:
        raise ValueError(f"policy {spec!r}: no policy given: want all, NAME[,NAME] or module:NAME")
    return specs


def scenario_specs(spec: str) -> List[Scenario]:
    """``all`` (the built-in scenarios) or a comma list of names and scenario files."""
    if spec == "all":
        return list(SCENARIOS.values())
    names = [s for s in spec.split(",") if s]
    if not names:
        raise SegmentError("bad_value", "no scenario given: want all, NAME[,NAME] or FILE.json")
    return [scenario(s) for s in names]


@dataclass(frozen=True)
class Result:
    policy: str
    scenario: str
    pcts: Tuple[float, ...]  # one per seed

    @property
    def mean(self) -> float:
        return sum(self.pcts) / len(self.pcts)

    @property
    def min(self) -> float:
        return min(self.pcts)

    def line(self) -> str:
        """The fixed-form line CI greps for."""
        return (
            f"evaluate: policy={self.policy} scenario={self.scenario} seeds={len(self.pcts)} "
            f"mean_pct={self.mean:.1f} min_pct={self.min:.1f}"
        )


def _run(job: Tuple[str, Scenario, int, float]) -> float:
    spec, sc, seed, interval = job
    return simulate(sc, policy_factory(spec)[1](), seed, interval)


def evaluate(
    policies: Sequence[str],
    scenarios: Sequence[Scenario],
    seeds: int = 5,
    *,
    interval: float = 0.5,
    jobs: Optional[int] = None,
) -> List[Result]:
    """Scores each policy (a spec for :func:`policy_factory`) on each scenario with seeds
    1..``seeds``, in ``jobs`` processes (default: the CPU count; 1 runs them here)."""
    if seeds < 1:
        raise ValueError(f"seeds {seeds}: want at least 1")
    if not policies or not scenarios:
        raise ValueError("evaluate: want at least one policy and one scenario")
    names = [policy_factory(p)[0] for p in policies]  # refuses a bad spec before any run
    work = [(p, sc, seed, interval) for p in policies for sc in scenarios for seed in range(1, seeds + 1)]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(work) == 1:
        pcts = [_run(w) for w in work]
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as ex:
            pcts = list(ex.map(_run, work))
    out, k = [], 0
    for name in names:
        for sc in scenarios:
            out.append(Result(name, sc.name, tuple(pcts[k : k + seeds])))
            k += seeds
    return out


def table(results: Sequence[Result]) -> List[str]:
    """One row per scenario, one column per policy: the mean percent of the optimum."""
    pols = list(dict.fromkeys(r.policy for r in results))
    scs = list(dict.fromkeys(r.scenario for r in results))
    cell = {(r.policy, r.scenario): r for r in results}
    w = max([len(p) for p in pols] + [8])
    lines = [f"{'scenario':<12}" + "".join(f" {p:>{w}}" for p in pols)]
    for s in scs:
        lines.append(f"{s:<12}" + "".join(f" {cell[(p, s)].mean:>{w}.1f}" for p in pols))
    return lines


__all__ = [
    "ALIASES",
    "BUILTIN",
    "ProportionalPolicy",
    "Result",
    "evaluate",
    "policy_factory",
    "policy_specs",
    "scenario_specs",
    "table",
    "vanilla",
]
