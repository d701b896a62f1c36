"""Scenarios from JSON files (``--scenario file.json``, ``sim.scenario("file.json")``); the
schema is in docs/agent.md, "Scenario files", with an example in testdata/scenarios/.

Every error is a SegmentError("bad_scenario") naming the file and the field
(``conns[0].sup.mbps: want a number >= 0, got "fast"``); unknown keys are refused, so a typo
never silently keeps a default.
"""

from __future__ import annotations

import ipaddress
import json
import math
from typing import Any, Dict, List, NoReturn, Optional, Tuple

from ._layout import RAIL_STATES
from ._types import SegmentError
from .sim import GBIT, NOISE_MAX, PID_BASE, Conn, Event, Rail, Scenario

_CLASSES = {"intra": 0, "inter": 1}


class _Fields:
    """Typed reads of one JSON object at ``where`` (for the error messages)."""

    def __init__(self, path: str, where: str, obj: Any, known: Tuple[str, ...]) -> None:
        self.path, self.where = path, where
        if not isinstance(obj, dict):
            self.fail(f"want a JSON object, got {json.dumps(obj)}")
        unknown = sorted(set(obj) - set(known))
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (known: {', '.join(known)})")
        self.obj: Dict[str, Any] = obj

    def fail(self, msg: str, key: str = "") -> NoReturn:
        at = ".".join(x for x in (self.where, key) if x)
        raise SegmentError("bad_scenario", f"{self.path}: {at + ': ' if at else ''}{msg}")

    def num(self, key: str, default: Optional[float] = None, *, positive: bool = False) -> Optional[float]:
        if key not in self.obj:
            return default
        v = self.obj[key]
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or not math.isfinite(v)
            or v < 0
            or (positive and v == 0)
        ):
            self.fail(f"want a number {'> 0' if positive else '>= 0'}, got {json.dumps(v)}", key)
        return float(v)

    def integer(self, key: str, default: Optional[int], limit: Optional[int] = None) -> Optional[int]:
        """An integer >= 0, and below ``limit`` when one is given (the field's width)."""
        if key not in self.obj:
            return default
        v = self.obj[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (limit is not None and v >= limit):
            want = "an integer >= 0" if limit is None else f"an integer 0..{limit - 1}"
            self.fail(f"want {want}, got {json.dumps(v)}", key)
        return int(v)

    def ipv4(self, key: str) -> str:
        """A dotted IPv4 address; "" when the key is absent."""
        v = self.text(key, "")
        if key in self.obj:
            try:
                ipaddress.IPv4Address(v)
            except ValueError:
                self.fail(f"want an IPv4 address (10.0.2.7), got {json.dumps(v)}", key)
        return v

    def text(self, key: str, default: str, choices: Tuple[str, ...] = ()) -> str:
        v = self.obj.get(key, default)
        if not isinstance(v, str) or (choices and v not in choices):
            want = f"one of {', '.join(choices)}" if choices else "a string"
            self.fail(f"want {want}, got {json.dumps(v)}", key)
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.obj.get(key, default)
        if not isinstance(v, bool):
            self.fail(f"want true or false, got {json.dumps(v)}", key)
        return v

    def rate_mbps(self) -> Optional[float]:
        """``mbps`` (Mbit/s) or ``gbps`` (Gbit/s), not both; None when neither is given."""
        if "mbps" in self.obj and "gbps" in self.obj:
            self.fail("give mbps or gbps, not both")
        key = "gbps" if "gbps" in self.obj else "mbps"
        v = self.num(key)
        if v is None:
            return None
        mbps = v * GBIT if key == "gbps" else v
        if not math.isfinite(mbps):
            self.fail(f"want a finite rate, got {json.dumps(self.obj[key])} ({mbps} Mbit/s)", key)
        return mbps


def _rail(path: str, where: str, obj: Any) -> Rail:
    f = _Fields(path, where, obj, ("mbps", "gbps", "latency_us"))
    mbps = f.rate_mbps()
    if mbps is None:
        f.fail("want the rail's capacity: mbps (Mbit/s) or gbps (Gbit/s)")
    lat = f.num("latency_us", 5.0)
    assert lat is not None
    return Rail(mbps, lat)


def _conn(path: str, where: str, obj: Any) -> Conn:
    f = _Fields(path, where, obj, ("sout", "sup", "process", "is_send", "path_class", "peer", "msg_bytes", "conn_id"))
    for rail in ("sout", "sup"):
        if rail not in f.obj:
            f.fail(f'want the {rail} rail: {{"gbps": 100}}')
    msg = f.integer("msg_bytes", 4 << 20, 1 << 53)  # the model computes in floats: exact up to 2**53
    if msg == 0:
        f.fail("want an integer > 0, got 0", "msg_bytes")
    return Conn(
        sout=_rail(path, f"{where}.sout", f.obj["sout"]),
        sup=_rail(path, f"{where}.sup", f.obj["sup"]),
        process=f.integer("process", 0, (1 << 32) - PID_BASE) or 0,  # pid PID_BASE + process: 32 bits
        is_send=f.flag("is_send", True),
        path_class=_CLASSES[f.text("path_class", "intra", tuple(_CLASSES))],
        peer=f.ipv4("peer"),
        msg_bytes=msg or 0,
        conn_id=f.integer("conn_id", None, 1 << 64),
    )


def _event(path: str, where: str, obj: Any, nconns: int, duration: float) -> Event:
    f = _Fields(path, where, obj, ("t", "rail", "mbps", "gbps", "state", "conn"))
    t = f.num("t")
    if t is None:
        f.fail("want t, the event's time in simulated seconds")
    if t > duration:
        f.fail(f"{t:g} is after the scenario's end (duration {duration:g})", "t")
    state = f.text("state", "", RAIL_STATES) if "state" in f.obj else None
    mbps = f.rate_mbps()
    if mbps is None and state is None:
        f.fail("an event changes mbps (or gbps), state, or both")
    conn = f.integer("conn", None)
    if conn is not None and conn >= nconns:
        f.fail(f"connection {conn}: the scenario has {nconns} (0..{nconns - 1})", "conn")
    return Event(t=t, rail=f.text("rail", "", ("sout", "sup")), mbps=mbps, state=state, conn=conn)


def scenario_from_dict(obj: Any, path: str = "<scenario>") -> Scenario:
    """A Scenario from the parsed JSON of a scenario file (``path`` names it in errors)."""
    f = _Fields(path, "", obj, ("name", "description", "duration", "noise", "sup_relay", "conns", "events"))
    duration = f.num("duration", 30.0, positive=True)
    noise = f.num("noise", 0.03)
    assert duration is not None and noise is not None
    if noise > NOISE_MAX:
        f.fail(f"want a number from 0 to {NOISE_MAX:g}, got {json.dumps(f.obj['noise'])}", "noise")
    conns_raw = f.obj.get("conns")
    if not isinstance(conns_raw, list) or not conns_raw:
        f.fail("want a non-empty list of connections", "conns")
    conns = tuple(_conn(path, f"conns[{i}]", c) for i, c in enumerate(conns_raw))
    events_raw = f.obj.get("events", [])
    if not isinstance(events_raw, list):
        f.fail("want a list of events", "events")
    events = tuple(_event(path, f"events[{i}]", e, len(conns), duration) for i, e in enumerate(events_raw))
    default = path.rsplit("/", 1)[-1].removesuffix(".json")
    return Scenario(
        name=f.text("name", default),
        description=f.text("description", f"from {path}"),
        conns=conns,
        events=events,
        duration=duration,
        noise=noise,
        sup_relay=f.flag("sup_relay", False),
    )


def load_scenario(path: str) -> Scenario:
    """The scenario in the JSON file at ``path`` (SegmentError("bad_scenario") when it is not
    one; OSError when it cannot be read)."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise SegmentError("bad_scenario", f"{path}: not JSON: {e}") from None
    return scenario_from_dict(obj, path)


def looks_like_file(name: str) -> bool:
    """A --scenario value that names a file rather than a built-in scenario."""
    return name.endswith(".json") or "/" in name


__all__: List[str] = ["load_scenario", "scenario_from_dict", "looks_like_file"]
