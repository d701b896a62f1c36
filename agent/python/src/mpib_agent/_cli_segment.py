"""mpib-agent-py's segment commands: create, list, set, top, record and gc, with the Go
``mpib-agent``'s flags, output and exit statuses (``record --raw`` is Python only)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import Dict, List, Optional, Tuple

from ._cli_args import (
    _UINT_RE,
    PROG,
    UsageError,
    _devs,
    _duration_s,
    _int,
    _only,
    _only_sample,
    _status,
    _stop_on_signals,
    _sup_bw,
    _warn,
)
from ._layout import MAX_PEERS, MAX_SLOTS, total_size
from ._policy import ConnRate, parse_conn, parse_peer, rates
from ._segment import Segment, create, now_ns, open_segment, parse_class, stale_ns_from_env
from ._types import SegmentError, Slot, Snapshot, class_name, sup_path_name
from ._watch import CSVWriter, sample, watch, write_jsonl


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


def _cmd_gc(a: argparse.Namespace) -> int:
    with open_segment(a.path) as seg:
        freed = seg.gc()
        print(f"reclaimed {len(freed)} slot(s)" + (":" + "".join(f" {i}" for i in freed) if freed else ""))
    return 0
