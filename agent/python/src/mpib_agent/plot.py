"""``mpib-agent-py plot TRACE -o out.png``: rates, split and rail states over time from a
trace (docs/agent.md, "Traces"). Needs the ``plot`` extra (matplotlib); the rest of the
package stays standard-library only."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ._layout import RAIL_STATES, SUP_BW_MAX
from .sim import Rail, optimum
from .trace import DEFAULT_MSG_BYTES, Trace, read_trace

INSTALL_HINT = "pip install mpib-agent[plot]"


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(f"plot needs matplotlib ({e}): {INSTALL_HINT}") from e
    return plt


Series = Dict[str, List[float]]


def send_series(tr: Trace) -> Dict[Tuple[int, int], Series]:
    """Per send connection (slot, gen): t and, per record, the completed rates, the applied
    split and hint as fractions, the rail states and, when recorded, the truth."""
    out: Dict[Tuple[int, int], Series] = {}
    for rec in tr.records:
        for c in rec["conns"]:
            if c.get("is_send") != 1:
                continue
            s = out.setdefault((c["slot"], c["gen"]), {})
            truth = c.get("truth") or {}
            vals = {
                "t": rec["t"],
                "sout_mbps": c.get("sout_completed_mbps", 0.0),
                "sup_mbps": c.get("sup_completed_mbps", 0.0),
                "split": c.get("applied_sup_bw", 0) / SUP_BW_MAX,
                "hint": c.get("last_sup_bw", 0) / SUP_BW_MAX,
                "sout_state": _state(c.get("sout_state")),
                "sup_state": _state(c.get("sup_state")),
                "opt_split": truth["opt_sup_bw"] / SUP_BW_MAX if "opt_sup_bw" in truth else float("nan"),
            }
            for k, v in vals.items():
                s.setdefault(k, []).append(v)
    return out


def _state(name: Any) -> float:
    return float(RAIL_STATES.index(name)) if name in RAIL_STATES else float(len(RAIL_STATES) - 1)


def capacity_steps(tr: Trace) -> Series:
    """The trace's capacities, states and best split as step series (t, value)."""
    msg = float(tr.header.get("msg_bytes", DEFAULT_MSG_BYTES))
    s: Series = {k: [] for k in ("t", "sout_mbps", "sup_mbps", "opt_split", "sout_state", "sup_state")}
    cur: List[Any] = [0.0, 0.0, "up", "up"]
    for p in tr.points:
        for k, v in enumerate((p.sout_mbps, p.sup_mbps, p.sout_state, p.sup_state)):
            if v is not None:
                cur[k] = v
        up = (cur[2] == "up" and cur[0] > 0, cur[3] == "up" and cur[1] > 0)
        w, _ = optimum(Rail(cur[0]), Rail(cur[1]), up, msg)
        for key, val in zip(s, (p.t, cur[0], cur[1], w / SUP_BW_MAX, _state(cur[2]), _state(cur[3]))):
            s[key].append(val)
    if s["t"] and tr.duration > s["t"][-1]:  # hold the last values to the end
        for key in s:
            s[key].append(tr.duration if key == "t" else s[key][-1])
    return s


def plot(trace_path: str, out_png: str, title: str = "") -> None:
    """Draws ``trace_path`` into ``out_png``: per-rail rates over the capacities, the split
    over the optimum, and the rail states (ImportError naming the extra without matplotlib)."""
    plt = _pyplot()
    tr = read_trace(trace_path)
    caps, conns = capacity_steps(tr), send_series(tr)
    fig, (ax_rate, ax_split, ax_state) = plt.subplots(
        3, 1, sharex=True, figsize=(9, 7), gridspec_kw={"height_ratios": [3, 2, 1]}
    )
    for rail, color in (("sout", "tab:blue"), ("sup", "tab:orange")):
        if caps["t"]:
            ax_rate.step(
                caps["t"],
                caps[f"{rail}_mbps"],
                where="post",
                color=color,
                ls="--",
                lw=1,
                label=f"{rail.upper()} capacity",
            )
        for (slot, _gen), s in conns.items():
            ax_rate.plot(s["t"], s[f"{rail}_mbps"], color=color, label=f"{rail.upper()} completed (slot {slot})")
            ax_state.step(s["t"], s[f"{rail}_state"], where="post", color=color, label=rail.upper())
        if not conns and caps["t"]:
            ax_state.step(caps["t"], caps[f"{rail}_state"], where="post", color=color, label=rail.upper())
    if caps["t"]:
        ax_split.step(caps["t"], caps["opt_split"], where="post", color="k", ls="--", lw=1, label="optimum")
    for (slot, _gen), s in conns.items():
        ax_split.plot(s["t"], s["split"], label=f"applied (slot {slot})")
        ax_split.plot(s["t"], s["hint"], ls=":", label=f"hint read (slot {slot})")
    ax_rate.set_ylabel("Mbit/s")
    ax_split.set_ylabel("SUP share")
    ax_split.set_ylim(-0.02, 1.02)
    ax_state.set_ylabel("rail state")
    ax_state.set_yticks(range(len(RAIL_STATES)), list(RAIL_STATES))
    ax_state.set_xlabel("s from the trace's start")
    for ax in (ax_rate, ax_split, ax_state):
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=7)
    fig.suptitle(title or f"{trace_path}: {tr.header.get('comment', '')}"[:110], fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)


__all__ = ["INSTALL_HINT", "capacity_steps", "plot", "send_series"]
