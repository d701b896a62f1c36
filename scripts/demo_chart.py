#!/usr/bin/env python3
"""Chart the demo's per-rail throughput timeline (build/demo/timeline.json) as a PNG."""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    pts = json.loads(src.read_text())
    if not pts:
        print("empty timeline", file=sys.stderr)
        return 1
    t = [p["t"] for p in pts]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot(t, [p["sout_mbps"] for p in pts], label="SOUT (a1 tx)")
    ax.plot(t, [p["sup_mbps"] for p in pts], label="SUP (a1 tx)")
    top = max(max(p["sout_mbps"], p["sup_mbps"]) for p in pts) or 1.0
    for p in pts:  # the failover phase's moments: the cut, the failover, the return
        if p.get("event"):
            ax.axvline(p["t"], color="red", linestyle="--", linewidth=0.8)
            ax.annotate(p["event"], (p["t"], top * 0.6), fontsize=8, rotation=90, va="top", color="red")
    last = None
    for p in pts:
        label = p["phase"] if p["hint"] < 0 else f"hint {p['hint']}"
        if label != last:
            ax.axvline(p["t"], color="gray", linewidth=0.5)
            ax.annotate(label, (p["t"], ax.get_ylim()[1] * 0.95), fontsize=8, rotation=90, va="top")
            last = label
    ax.set_xlabel("seconds")
    ax.set_ylabel("Mbit/s")
    ax.set_title("MPIB demo: vanilla, the agent moving the split, then SUP cut and back (failover)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"demo: chart written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
