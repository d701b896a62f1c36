#!/usr/bin/env python3
"""Turn the benchmark JSON (build/bench/*.json) into docs/benchmarks.md's results table and
docs/benchmarks.png. Run by `go run mage.go bench` with matplotlib from build/venv-tools.

    bench_report.py BENCH_DIR DOC.md            table between the markers, and DOC.png
    bench_report.py --table-only BENCH_DIR DOC.md   the table only (no matplotlib needed)

Each ratio figure carries its median over interleaved pairs and a 90 % bootstrap interval
of that median (ci_low, ci_high: integration/benchstat); the plot draws them as error bars.
"""
import json
import math
import pathlib
import sys

TARGETS = {
    "P1": ">= 0.95 for >= 1 MiB",
    "P2": ">= 0.95 (proportional)",
    "P3": "<= 1.15",
    "P4": "<= 1,000 instructions; advanced <= vanilla + 150",
    "P5": ">= 0.95 vs one rail",
    "connect": "8 comms <= 0.13 s; 512: each call <= 50 ms",
    "resources": "watch",
    "memory": "<= 360 KiB per pair",
    "mesh-bw": ">= 0.95 direct, >= 0.90 routed; all-pairs >= 2.7, parallel >= 1.8 (vs one link)",
}
NAMES = ("p1", "p2", "p3", "p4", "p5", "connect8", "scale", "memory", "mesh")


def load(d: pathlib.Path, name: str) -> list:
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else []


def is_ratio(f: dict) -> bool:
    return bool(f.get("ratios"))


def fmt_ci(ratio: float, lo: float, hi: float) -> str:
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (ratio, lo, hi)):
        return "-"
    return f"{ratio:.3f} [{lo:.3f}, {hi:.3f}]"


def fmt_val(v: float, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("msgs/s", "instructions"):
        return f"{v:,.0f} {unit}"
    return f"{v:.1f} {unit}" if abs(v) >= 10 else f"{v:.3f} {unit}"


def case(f: dict) -> str:
    key = f["key"]
    if f["name"] == "P3" and f.get("preposted") is not None:
        key += " preposted=" + ("true" if f["preposted"] else "false")
    return key


def table(figs: list) -> str:
    rows = [
        "| Figure | Case | Ratio, median [90 % CI] | Pairs | Plugin | Reference | Second reference: ratio [90 % CI] (value) | Target | Also measured |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f in figs:
        unit = f.get("unit", "")
        if is_ratio(f):
            ratio = fmt_ci(f["ratio"], f.get("ci_low"), f.get("ci_high"))
            pairs = str(f.get("pairs") or len(f["ratios"]))
            ref = fmt_val(f["ref"], unit)
        else:
            ratio, pairs, ref = "-", "-", "-"
        alt = "-"
        if f.get("alt_label"):
            alt = (f"{f['alt_label']}: {fmt_ci(f.get('alt_ratio'), f.get('alt_ci_low'), f.get('alt_ci_high'))}"
                   f" ({fmt_val(f.get('alt_ref'), unit)})")
        target = TARGETS.get(f["name"], "-")
        rows.append(f"| {f['name']} | {case(f)} | {ratio} | {pairs} | {fmt_val(f['plugin'], unit)} | {ref} | {alt} | {target} | {f.get('note', '')} |")
    return "\n".join(rows)


def errbars(figs: list, alt: bool = False):
    """Median ratios and asymmetric error bars [[below], [above]] from the intervals."""
    k = "alt_" if alt else ""
    ys = [f.get(f"{k}ratio", math.nan) for f in figs]
    lo = [max(0.0, y - f.get(f"{k}ci_low", y)) for f, y in zip(figs, ys)]
    hi = [max(0.0, f.get(f"{k}ci_high", y) - y) for f, y in zip(figs, ys)]
    return ys, [lo, hi]


def size_of(f: dict) -> int:
    return int(f["key"].split()[0].split("=")[1])


def plot(p1: list, p2: list, p3: list, p5: list, out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (ax1, ax2), (ax3, ax5) = axes
    if p1:
        xs = [size_of(f) for f in p1]
        ys, err = errbars(p1)
        ax1.errorbar(xs, ys, yerr=err, fmt="o-", capsize=4, label="vs ib_write_bw (depth 128)")
        if any(f.get("alt_label") for f in p1):
            ys, err = errbars(p1, alt=True)
            ax1.errorbar([x * 1.08 for x in xs], ys, yerr=err, fmt="s--", capsize=4, label="vs ib_write_bw --tx-depth 8")
        ax1.axhline(0.95, color="gray", linestyle=":", label="target 0.95 (>= 1 MiB)")
        ax1.set_xscale("log", base=2)
        ax1.set_xlabel("message size (bytes)")
        ax1.set_ylabel("plugin / reference")
        ax1.set_title("P1: one soft-RoCE rail (SUP), throughput ratio")
        ax1.legend(fontsize=8)
    if p2:
        pts = sorted(p2, key=lambda f: f.get("sup_share", 0.0))
        labels = [f"{f['key'].split('=')[1]}\n(SUP {f.get('sup_share', 0.0):.2f})" for f in pts]
        xs = list(range(len(pts)))
        ys, err = errbars(pts)
        ax2.errorbar(xs, ys, yerr=err, fmt="o", capsize=5, label="vs sum of both rails' ib_write_bw (each alone)")
        if any(f.get("alt_label") for f in pts):
            ys, err = errbars(pts, alt=True)
            ax2.errorbar([x + 0.1 for x in xs], ys, yerr=err, fmt="s", capsize=5, label="vs ib_write_bw on both rails at once")
        ax2.axhline(0.95, color="gray", linestyle=":", label="target 0.95 (proportional)")
        ax2.set_xticks(xs, labels)
        ax2.set_ylabel("plugin / reference")
        ax2.set_title("P2: SOUT 25 Mbit/s + SUP 50 Mbit/s, 4 MiB")
        ax2.legend(fontsize=8, loc="lower right")
    if p3:
        xs = list(range(len(p3)))
        ys, err = errbars(p3)
        ax3.errorbar(xs, ys, yerr=err, fmt="o", capsize=5)
        ax3.set_xticks(xs, ["receive preposted\n(NCCL's 8 steps)" if f.get("preposted") else "receive posted\nafter the send" for f in p3])
        ax3.axhline(1.15, color="gray", linestyle=":", label="target 1.15")
        ax3.axhline(1.0, color="black", linewidth=0.5)
        ax3.set_ylabel("plugin / ib_write_lat (one-way, 8 B)")
        ax3.set_title("P3: latency ratio")
        ax3.set_xlim(-0.5, len(p3) - 0.5)
        ax3.legend(fontsize=8)
    if p5:
        xs = [size_of(f) for f in p5]
        ys, err = errbars(p5)
        ax5.errorbar(xs, ys, yerr=err, fmt="o-", capsize=4, label="two rails (512/1024) / one rail")
        if any(f.get("alt_label") for f in p5):
            ys, err = errbars(p5, alt=True)
            ax5.errorbar([x * 1.08 for x in xs], ys, yerr=err, fmt="s--", capsize=4, label="two rails / ib_write_bw (SUP)")
        ax5.axhline(0.95, color="gray", linestyle=":", label="target 0.95 (vs one rail)")
        ax5.set_xscale("log", base=2)
        ax5.set_xlabel("message size (bytes)")
        ax5.set_ylabel("message-rate ratio")
        ax5.set_title("P5: message rate, window 8")
        ax5.legend(fontsize=8)
    for ax in axes.flat:
        if not ax.has_data():
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list) -> int:
    table_only = "--table-only" in argv
    args = [a for a in argv[1:] if a != "--table-only"]
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d, doc = pathlib.Path(args[0]), pathlib.Path(args[1])
    figs = {n: load(d, n) for n in NAMES}
    if not table_only:
        plot(figs["p1"], figs["p2"], figs["p3"], figs["p5"], doc.with_suffix(".png"))
    text = doc.read_text()
    begin, end = "<!-- results:begin -->", "<!-- results:end -->"
    if begin not in text or end not in text:
        print(f"{doc} lacks the {begin} / {end} markers", file=sys.stderr)
        return 1
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(head + begin + "\n" + table([f for n in NAMES for f in figs[n]]) + "\n" + end + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
