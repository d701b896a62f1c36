#!/usr/bin/env python3
"""Turn the benchmark JSON (build/bench/p*.json) into docs/benchmarks.md's results table and
docs/benchmarks.png. Run by `go run mage.go bench` with matplotlib from build/venv-tools."""
import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TARGETS = {"P1": ">= 0.95 for >= 1 MiB", "P2": ">= 0.95 (proportional)", "P3": "<= 1.15", "P4": "watch"}


def load(d: pathlib.Path, name: str) -> list:
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else []


def table(figs: list) -> str:
    rows = ["| Figure | Case | Ratio (median) | Plugin | Reference | Spread of ratios | Target | Also measured |",
            "|---|---|---|---|---|---|---|---|"]
    for f in figs:
        ratios = f.get("ratios") or []
        spread = f"{max(ratios) - min(ratios):.3f} over {len(ratios)} runs" if ratios else "-"
        ratio = f"{f['ratio']:.3f}" if f["name"] != "P4" else "-"
        ref = f"{f['ref']:.1f} {f['unit']}" if f["name"] != "P4" else "-"
        rows.append(f"| {f['name']} | {f['key']} | {ratio} | {f['plugin']:.1f} {f['unit']} | {ref} | {spread} | {TARGETS[f['name']]} | {f.get('note', '')} |")
    return "\n".join(rows)


def plot(p1: list, p2: list, out: pathlib.Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    if p1:
        sizes = [int(f["key"].split("=")[1]) for f in p1]
        ax1.plot(sizes, [f["plugin"] for f in p1], "o-", label="MPIB (vanilla, SUP)")
        ax1.plot(sizes, [f["ref"] for f in p1], "s--", label="ib_write_bw (SUP)")
        ax1.set_xscale("log", base=2)
        ax1.set_xlabel("message size (bytes)")
        ax1.set_ylabel("Mbit/s")
        ax1.set_title("P1: one soft-RoCE rail")
        ax1.legend()
    if p2:
        pts = sorted(p2, key=lambda f: f.get("sup_share", 0.0))
        ax2.plot([f.get("sup_share", 0.0) for f in pts], [f["plugin"] for f in pts], "o-", label="MPIB")
        ax2.axhline(pts[0]["ref"], color="gray", linestyle="--", label="sum of both rails' ib_write_bw (each alone)")
        if pts[0].get("concurrent_ref"):
            ax2.axhline(pts[0]["concurrent_ref"], color="gray", linestyle=":", label="ib_write_bw on both rails at once")
        for f in pts:
            ax2.annotate(f["key"].split("=")[1], (f.get("sup_share", 0.0), f["plugin"]), textcoords="offset points", xytext=(4, 4))
        ax2.set_xlabel("SUP share of each message")
        ax2.set_ylabel("Mbit/s")
        ax2.set_title("P2: SOUT 25 Mbit/s + SUP 50 Mbit/s")
        ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    d = pathlib.Path(sys.argv[1])
    doc = pathlib.Path(sys.argv[2])
    p1, p2, p3, p4 = (load(d, n) for n in ("p1", "p2", "p3", "p4"))
    plot(p1, p2, doc.with_suffix(".png"))
    text = doc.read_text()
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin not in text or end not in text:
        print(f"{doc} lacks the {begin} / {end} markers", file=sys.stderr)
        return 1
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(head + begin + "\n" + table(p1 + p2 + p3 + p4) + "\n" + end + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
