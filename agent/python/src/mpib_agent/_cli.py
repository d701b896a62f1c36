"""mpib-agent-py: the Python agent's command line (same commands as the Go mpib-agent)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import warnings
from dataclasses import asdict
from typing import Callable, Dict, List, Optional, Sequence

from ._format import SegmentError, heartbeat_fresh
from ._policy import ConnRate, Proportional, install_sigterm_stop, rates, run_policy
from ._segment import Segment, create, default_path, now_ns, open_segment, stale_ns_from_env


def _status(seg: Segment) -> str:
    h = seg.header()
    if h.heartbeat_ns == 0:
        return "agent: none (hints do not apply; plugins use the vanilla policy)"
    age = (now_ns() - h.heartbeat_ns) / 1e6
    ok = heartbeat_fresh(h.heartbeat_ns, now_ns(), stale_ns_from_env())
    state = "alive" if ok else "STALE (plugins use the vanilla policy)"
    return f"agent: pid {h.agent_pid}, last beat {age:.0f} ms ago, {state}"


def _cmd_create(a: argparse.Namespace) -> int:
    if os.path.exists(a.path) and not a.force:
        raise SegmentError("exists", "use --force to replace it", a.path)
    with create(a.path, a.slots, a.peers):
        print(f"created {a.path}: {a.slots} slots, {a.peers} peers, mode 0600")
    return 0


def _cmd_list(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        rows = [(c, seg.resolve(c.index)) for c in seg.connections()]
        if a.json:
            out = [dict(asdict(c), effective=asdict(r)) for c, r in rows]
            print(json.dumps(out, indent=2))
            return 0
        print(_status(seg))
        fmt = "{:>5} {:>14} {:>15} {:>15} {:>5} {:>4} {:>5} {:>5} {:>8} {:>14} {:>14}"
        print(fmt.format("SLOT", "PID:CONN", "LOCAL", "PEER", "CLASS", "DIR", "QPS", "HINT", "SOURCE", "SOUT_BYTES", "SUP_BYTES"))
        for c, r in rows:
            print(
                fmt.format(
                    c.index, f"{c.pid}:{c.conn_id}", c.local_sout_ip, c.peer_sout_ip,
                    "intra" if c.path_class == 0 else "inter", "send" if c.is_send else "recv",
                    f"{c.nqps_sout}+{c.nqps_sup}", r.sup_bw if r.applies else "-", r.source,
                    c.telemetry.sout_bytes, c.telemetry.sup_bytes,
                )
            )
    return 0


def _find_conn(seg: Segment, sel: str) -> int:
    pid, sep, conn = sel.partition(":")
    for c in seg.connections():
        if (sep and c.pid == int(pid) and c.conn_id == int(conn)) or (not sep and c.index == int(sel)):
            return c.index
    raise SegmentError("slot_inactive", f"no active connection {sel}", seg.path)


def _cmd_set(a: argparse.Namespace) -> int:
    if sum(x is not None for x in (a.conn, a.peer, a.cls)) != 1:
        raise SegmentError("usage", "give exactly one of --conn, --peer, --class")
    if a.clear == (a.sup_bw is not None):
        raise SegmentError("usage", "give either --sup-bw N or --clear")
    bw: Optional[int] = None if a.clear else a.sup_bw
    with open_segment(a.path) as seg:
        if a.conn is not None:
            slot = _find_conn(seg, a.conn)
            v, what = seg.set_slot_hint(slot, bw), f"slot {slot}"
        elif a.peer is not None:
            v, what = seg.set_peer_hint(a.peer, bw), f"peer {a.peer}"
        else:
            v, what = seg.set_class_hint(a.cls, bw), f"class {a.cls}"
        print(f"{what}: cleared" if bw is None else f"{what}: sup_bw={v}")
        if not seg.agent_alive():
            print("mpib-agent-py: warning: no live agent heartbeat: the hint applies once "
                  "`mpib-agent-py heartbeat` or `run` is running", file=sys.stderr)
    return 0


def _frame(seg: Segment, rs: List[ConnRate], clear: bool) -> None:
    if clear:
        sys.stdout.write("\x1b[H\x1b[2J")
    print(f"mpib-agent-py top  {seg.path}  {_status(seg)}")
    fmt = "{:>5} {:>15} {:>5} {:>5} {:>8} {:>10} {:>10} {:>9}"
    print(fmt.format("SLOT", "PEER", "CLASS", "HINT", "SOURCE", "SOUT Gb/s", "SUP Gb/s", "SUP share"))
    ts = tp = 0.0
    for r in rs:
        res = seg.resolve(r.slot.index)
        ts, tp = ts + r.sout_bps, tp + r.sup_bps
        print(fmt.format(r.slot.index, r.slot.peer_sout_ip, "intra" if r.slot.path_class == 0 else "inter",
                         res.sup_bw if res.applies else "-", res.source, f"{r.sout_bps * 8e-9:.2f}",
                         f"{r.sup_bps * 8e-9:.2f}", f"{r.sup_share:.3f}"))
    share = tp / (ts + tp) if ts + tp > 0 else 0.0
    print(fmt.format("total", "", "", "", "", f"{ts * 8e-9:.2f}", f"{tp * 8e-9:.2f}", f"{share:.3f}"))
    sys.stdout.flush()


def _cmd_top(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        prev, prev_t = {s.index: s for s in seg.connections()}, now_ns()
        i = 0
        try:
            while a.count == 0 or i < a.count:
                time.sleep(a.interval)
                cur, cur_t = {s.index: s for s in seg.connections()}, now_ns()
                _frame(seg, rates(prev, cur, (cur_t - prev_t) / 1e9), not a.plain)
                prev, prev_t, i = cur, cur_t, i + 1
        except KeyboardInterrupt:
            pass
    return 0


def _daemon(seg: Segment, callback: Callable[[List[ConnRate]], Optional[Dict[int, int]]], interval: float) -> None:
    stop = threading.Event()
    install_sigterm_stop(stop)
    run_policy(seg, callback, interval, stop=stop)


def _cmd_heartbeat(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        print(f"heartbeat: pid {os.getpid()} beating {a.path} every 100 ms (stop with SIGINT/SIGTERM)", flush=True)

        def tick(_: List[ConnRate]) -> None:
            seg.gc()

        _daemon(seg, tick, 5.0)
    return 0


def _static_callback(seg: Segment, path: str) -> Callable[[List[ConnRate]], Optional[Dict[int, int]]]:
    state: Dict[str, object] = {"mtime": None}

    def apply(_: List[ConnRate]) -> None:
        m = os.stat(path).st_mtime_ns
        if m == state["mtime"]:
            return
        with open(path, "rb") as f:
            w = json.load(f)
        unknown = set(w) - {"class", "peers", "conns"}
        if unknown:
            raise SegmentError("bad_weights", f"unknown fields {sorted(unknown)}", path)
        for c, v in sorted(w.get("class", {}).items()):
            seg.set_class_hint(c, int(v))
        for p, v in sorted(w.get("peers", {}).items()):
            seg.set_peer_hint(p, int(v))
        for sel, v in sorted(w.get("conns", {}).items()):
            try:
                seg.set_slot_hint(_find_conn(seg, sel), int(v))
            except SegmentError as e:
                print(f"mpib-agent-py: warning: {e}", file=sys.stderr)
        state["mtime"] = m
        print("policy: static weights applied", flush=True)

    return apply


def _cmd_run(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        if a.policy == "static":
            if not a.file:
                raise SegmentError("usage", "--policy static needs --file weights.json")
            cb = _static_callback(seg, a.file)
        else:
            caps = dict(kv.split("=", 1) for kv in a.capacity.split(",")) if a.capacity else {}
            p = Proportional(cap_sout=float(caps.get("sout", 0)), cap_sup=float(caps.get("sup", 0)))

            def cb(rs: List[ConnRate]) -> Dict[int, int]:
                p.observe(rs)
                bw = p.sup_bw()
                return {c.index: bw for c in seg.connections() if c.is_send}

        print(f"run: pid {os.getpid()}, policy {a.policy}, interval {a.interval}s, segment {a.path}", flush=True)
        _daemon(seg, cb, a.interval)
    return 0


def _cmd_gc(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        freed = seg.gc()
        print(f"reclaimed {len(freed)} slot(s) {freed}")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mpib-agent-py", description="MPIB hint segment agent (Python)")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help)
        p.add_argument("--path", default=default_path(), help="segment file")
        return p

    p = cmd("create", "create the segment (mode 0600)")
    p.add_argument("--slots", type=int, default=1024)
    p.add_argument("--peers", type=int, default=256)
    p.add_argument("--force", action="store_true")
    p.set_defaults(fn=_cmd_create)
    p = cmd("list", "list connections and their hints")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=_cmd_list)
    p = cmd("set", "set or clear a hint")
    p.add_argument("--conn", help="SLOT or PID:CONN_ID")
    p.add_argument("--peer", help="IP or IP/LEN")
    p.add_argument("--class", dest="cls", help="intra or inter")
    p.add_argument("--sup-bw", type=int, help="parts per 1024 (0 all SOUT .. 1024 all SUP)")
    p.add_argument("--clear", action="store_true")
    p.set_defaults(fn=_cmd_set)
    p = cmd("top", "live per-rail throughput")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--plain", action="store_true")
    p.set_defaults(fn=_cmd_top)
    for name in ("heartbeat", "daemon"):
        cmd(name, "beat until killed").set_defaults(fn=_cmd_heartbeat)
    p = cmd("run", "policy loop with heartbeat")
    p.add_argument("--policy", choices=("static", "proportional"), default="static")
    p.add_argument("--file", help="static: weights JSON")
    p.add_argument("--capacity", default="", help="proportional: sout=X,sup=Y")
    p.add_argument("--interval", type=float, default=1.0)
    p.set_defaults(fn=_cmd_run)
    cmd("gc", "reclaim slots of dead processes").set_defaults(fn=_cmd_gc)
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    a = _parser().parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, *_a, **_k: print(f"mpib-agent-py: warning: {m}", file=sys.stderr)
        try:
            rc: int = a.fn(a)
            return rc
        except (SegmentError, OSError, ValueError) as e:
            print(f"mpib-agent-py {a.cmd}: {e}", file=sys.stderr)
            return 1
