"""Telemetry samples: ``watch`` (API), ``top --json`` and ``record`` (CLI). The Go agent's
``top --json`` prints the same fields."""

from __future__ import annotations

import csv
import json
import threading
import time
from dataclasses import asdict
from typing import IO, Any, Dict, Generator, List, Optional, Tuple

from ._policy import rates
from ._segment import Segment, now_ns, open_segment
from ._types import SegmentError, Slot

CONN_FIELDS = (
    "slot",
    "gen",
    "pid",
    "conn_id",
    "is_send",
    "path_class",
    "sout_mbps",
    "sup_mbps",
    "last_sup_bw",
    "sout_state",
    "sup_state",
    "sout_completed_mbps",
    "sup_completed_mbps",
    "sout_latency_us",
    "sup_latency_us",
    "sout_inflight_bytes",
    "sup_inflight_bytes",
    "applied_sup_bw",
    "flush_wall_ns",
    "dev",
    "sout_nic",
    "sup_nic",
)  # ends with the connection's fused device and its NICs
CSV_FIELDS = ("t",) + CONN_FIELDS


def _num(x: float) -> float:
    """Mbit/s (or microseconds) to 3 decimals; an integral value as an int, so that JSON and
    CSV print it as the Go agent does (0, not 0.0)."""
    v = round(x, 3)
    return int(v) if v.is_integer() else v


def sample(prev: Dict[int, Slot], cur: Dict[int, Slot], dt_s: float, t: Optional[float] = None) -> Dict[str, Any]:
    """One sample: {"t": unix seconds, "conns": [...]} for the connections present in both
    snapshots with the same gen, rates in Mbit/s over ``dt_s``."""
    conns: List[Dict[str, Any]] = []
    for r in rates(prev, cur, dt_s):
        s, tel = r.slot, r.slot.telemetry
        conns.append(
            {
                "slot": s.index,
                "gen": s.gen,
                "pid": s.pid,
                "conn_id": s.conn_id,
                "is_send": s.is_send,
                "path_class": s.path_class,
                "sout_mbps": _num(r.sout_bps * 8e-6),
                "sup_mbps": _num(r.sup_bps * 8e-6),
                "last_sup_bw": tel.last_sup_bw,
                "sout_state": tel.sout_state,
                "sup_state": tel.sup_state,
                "sout_completed_mbps": _num(r.sout_completed_bps * 8e-6),
                "sup_completed_mbps": _num(r.sup_completed_bps * 8e-6),
                "sout_latency_us": _num(round(r.sout_latency_ns) / 1e3),
                "sup_latency_us": _num(round(r.sup_latency_ns) / 1e3),
                "sout_inflight_bytes": tel.sout_inflight_bytes,
                "sup_inflight_bytes": tel.sup_inflight_bytes,
                "applied_sup_bw": tel.applied_sup_bw,
                "flush_wall_ns": tel.flush_wall_ns,
                "dev": s.dev,
                "sout_nic": s.sout_nic,
                "sup_nic": s.sup_nic,
            }
        )
    return {"t": time.time_ns() // 1000 / 1e6 if t is None else t, "conns": conns}


def _snap(seg: Segment) -> Dict[int, Slot]:
    return {s.index: s for s in seg.connections()}


def raw_sample(
    prev: Dict[int, Slot],
    cur: Dict[int, Slot],
    dt_s: float,
    truth: Optional[Dict[Tuple[int, int], Dict[str, Any]]] = None,
    t: Optional[float] = None,
) -> Dict[str, Any]:
    """A :func:`sample` whose connections also carry ``raw``, every telemetry field of the
    segment (as ``list --json`` prints them under ``telemetry``), and, when ``truth`` (by
    slot and gen, as :func:`mpib_agent.sim.read_truth` returns it) has the connection,
    ``truth``: the simulator's rails and optimum (``record --raw``, docs/agent.md "Traces")."""
    s = sample(prev, cur, dt_s, t)
    for c in s["conns"]:
        c["raw"] = asdict(cur[c["slot"]].telemetry)
        tr = (truth or {}).get((c["slot"], c["gen"]))
        if tr is not None:
            c["truth"] = {k: v for k, v in tr.items() if k not in ("slot", "gen")}
    return s


def watch(
    path: Optional[str] = None,
    interval: float = 1.0,
    *,
    count: Optional[int] = None,
    stop: Optional[threading.Event] = None,
    raw: bool = False,
) -> Generator[Dict[str, Any], None, None]:
    """Yields a sample (see :func:`sample`) every ``interval`` seconds: per connection its
    slot, gen, pid, conn_id, is_send, path_class, per-rail posted rates (``sout_mbps``,
    ``sup_mbps``, Mbit/s), ``last_sup_bw`` and rail states, and the completion telemetry:
    per-rail completed rates (``sout_completed_mbps``, ``sup_completed_mbps``), mean completion
    latency over the interval (``sout_latency_us``, ``sup_latency_us``, 0 when nothing
    completed), bytes in flight (``sout_inflight_bytes``, ``sup_inflight_bytes``), the split
    the plugin applied (``applied_sup_bw``) and its last flush (``flush_wall_ns``,
    CLOCK_REALTIME), and the plugin's fused device with its NICs (``dev``, ``sout_nic``,
    ``sup_nic``). A connection appears from its
    second sample on (a rate needs two). Stops after ``count`` samples or when ``stop`` is set
    (or when the caller stops iterating); follows a segment replaced at the path. With
    ``raw``, each sample is a :func:`raw_sample`, with the ground truth of a simulator
    (``mpib-agent-py sim``) that drives the segment."""
    if not interval > 0:
        raise ValueError(f"interval {interval!r}: want seconds above 0")
    stop = stop or threading.Event()
    with open_segment(path) as seg:
        prev, prev_t = _snap(seg), now_ns()
        n = 0
        next_t = time.monotonic() + interval
        while count is None or n < count:
            if stop.wait(max(next_t - time.monotonic(), 0.0)):
                return
            next_t += interval
            try:
                if seg.reattach():
                    prev, prev_t = {}, now_ns()
                cur_t, cur = now_ns(), _snap(seg)
            except SegmentError as e:
                if e.code != "segment_gone":
                    raise
                cur_t, cur = now_ns(), {}
            if raw:
                from .sim import read_truth  # the ground truth a live simulator publishes

                yield raw_sample(prev, cur, (cur_t - prev_t) / 1e9, read_truth(seg.path))
            else:
                yield sample(prev, cur, (cur_t - prev_t) / 1e9)
            prev, prev_t, n = cur, cur_t, n + 1


def write_jsonl(out: IO[str], s: Dict[str, Any]) -> None:
    out.write(json.dumps(s, separators=(",", ":")) + "\n")
    out.flush()


class CSVWriter:
    """One row per connection per sample; header ``t`` + the connection fields."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.w = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
        self.w.writeheader()
        out.flush()

    def write(self, s: Dict[str, Any]) -> None:
        for c in s["conns"]:
            self.w.writerow(dict(c, t=f"{s['t']:.6f}"))
        self.out.flush()


__all__ = ["watch", "sample", "raw_sample", "CONN_FIELDS", "CSV_FIELDS", "CSVWriter", "write_jsonl"]
