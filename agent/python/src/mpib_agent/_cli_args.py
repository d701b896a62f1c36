"""mpib-agent-py: what its commands share. The program's name, the usage error (exit 2),
warnings, the agent's status line, the flag parsers (their messages are the Go CLI's), the
--dev filter and the block that SIGINT and SIGTERM end."""

from __future__ import annotations

import contextlib
import math
import re
import signal
import sys
import threading
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

from ._policy import signal_setter
from ._resolve import heartbeat_fresh
from ._segment import Segment, now_ns, stale_ns_from_env
from ._types import Slot

PROG = "mpib-agent-py"


class UsageError(Exception):
    """A wrong command line (exit 2)."""


def _warn(msg: object) -> None:
    print(f"{PROG}: warning: {msg}", file=sys.stderr, flush=True)


def _status(seg: Segment) -> str:
    h = seg.header()
    if h.heartbeat_ns == 0:
        return "agent: none (hints do not apply; plugins use the vanilla policy)"
    now = now_ns()
    age = int((now - h.heartbeat_ns) / 1e6)
    ok = heartbeat_fresh(h.heartbeat_ns, now, stale_ns_from_env())
    state = "alive" if ok else "STALE (plugins use the vanilla policy)"
    return f"agent: pid {h.agent_pid}, last beat {age} ms ago, {state}"


_DUR_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)?$")
_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, None: 1e9, "m": 60e9, "h": 3600e9}
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_UINT_RE = re.compile(r"^[0-9]+$")
_NUM_RE = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")


def _duration_s(flag: str, s: str) -> float:
    """Seconds (0.5) or a number with a unit (500ms, 2s, 1m); > 0. Returns seconds."""
    m = _DUR_RE.match(s)
    if m is None:
        raise UsageError(f"--{flag} {s!r}: want seconds (0.5) or a number with a unit (500ms, 2s, 1m)")
    ns = math.floor(float(m.group(1)) * _UNITS[m.group(2)] + 0.5)
    if ns < 1 or ns > (1 << 62):
        raise UsageError(f"--{flag} {s!r}: must be above 0")
    return ns / 1e9


def _fmt_ms(seconds: float) -> str:
    """A duration the way both CLIs print it: milliseconds, up to 3 decimals."""
    us = math.floor(seconds * 1e6 + 0.5)
    return f"{us / 1e3:.3f}".rstrip("0").rstrip(".") + " ms"


def _int(flag: str, s: str) -> int:
    if _INT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--{flag} {s!r}: want an integer")
    return int(s)


def _sup_bw(s: str) -> int:
    if _UINT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--sup-bw {s!r}: want an integer 0..1024 (larger values are clamped)")
    return min(int(s), 0xFFFFFFFF)


def _capacity(v: str) -> Tuple[float, float]:
    """sout=X,sup=Y (both rails; X, Y >= 0), "" for none (measure). One rail alone is
    refused: the other would be taken as 0 and get no traffic."""
    caps: Dict[str, float] = {}
    if v == "":
        return 0.0, 0.0
    for kv in v.split(","):
        k, sep, val = kv.partition("=")
        if not sep or _NUM_RE.match(val) is None or not val.isascii() or not math.isfinite(float(val)):
            raise UsageError(f"--capacity {v!r}: want sout=X,sup=Y with numbers >= 0")
        if k in caps:
            raise UsageError(f"--capacity {v!r}: rail {k!r} given twice")
        if k not in ("sout", "sup"):
            raise UsageError(f"--capacity {v!r}: unknown rail {k!r} (sout, sup)")
        caps[k] = float(val)
    for rail in ("sout", "sup"):
        if rail not in caps:
            raise UsageError(
                f'--capacity {v!r}: rail "{rail}" missing: give both, sout=X,sup=Y (or neither, to measure)'
            )
    return caps["sout"], caps["sup"]


MAX_DEV = 0xFFFF  # dev is a u16 (the plugin writes 0..15)


def _devs(values: Optional[List[str]]) -> Optional[FrozenSet[int]]:
    """--dev N, repeatable, each a comma list (--dev 0,1 --dev 3): the devices whose
    connections to keep; None (no --dev): all."""
    if not values:
        return None
    out = set()
    for v in values:
        for d in v.split(","):
            if _UINT_RE.match(d) is None or not d.isascii() or int(d) > MAX_DEV:
                raise UsageError(
                    f"--dev {v!r}: want device indexes 0..{MAX_DEV}, comma-separated (--dev 0,1) "
                    "or repeated (--dev 0 --dev 1)"
                )
            out.add(int(d))
    return frozenset(out)


def _only(devs: Optional[FrozenSet[int]], slots: Iterable[Slot]) -> List[Slot]:
    """The connections of ``devs`` (all when None)."""
    return [s for s in slots if devs is None or s.dev in devs]


def _only_sample(devs: Optional[FrozenSet[int]], smp: Dict[str, Any]) -> Dict[str, Any]:
    """A telemetry sample (``_watch.sample``) with the connections of ``devs`` only."""
    if devs is None:
        return smp
    return dict(smp, conns=[c for c in smp["conns"] if c["dev"] in devs])


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event that SIGINT and SIGTERM set while the block runs (then the old handlers)."""
    stop = threading.Event()
    old = {sig: signal.signal(sig, signal_setter(stop)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def _seed(s: Optional[str], default: Optional[int]) -> Optional[int]:
    if s is None:
        return default
    if _UINT_RE.match(s) is None or not s.isascii():
        raise UsageError(f"--seed {s!r}: want an integer >= 0")
    return int(s)


def _speed(s: str) -> float:
    if _NUM_RE.match(s) is None or not s.isascii() or float(s) <= 0 or float(s) > 1e6:
        raise UsageError(f"--speed {s!r}: want a number above 0 (1 = real time, 10 = ten times faster)")
    return float(s)
