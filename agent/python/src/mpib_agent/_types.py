"""The values a segment holds (records, header, slots, telemetry, snapshot, resolution), the
errors and warnings of segment operations, and the conversions both CLIs print values with."""

from __future__ import annotations

import ipaddress
import numbers
import operator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional, Union

from ._layout import FLAG_VALID, NIC_NAME, RAIL_STATES, STATE_FREE, SUP_PATHS, VERSION


class SegmentError(ValueError):
    """Any refusal or failed operation. ``code`` is the spec's validation code (bad_magic,
    bad_version, too_small, bad_geometry, not_regular, bad_owner, bad_mode) or an operation
    code (slot_range, slot_inactive, gen_changed, peer_table_full, slots_full, bad_class,
    bad_prefix, bad_value, segment_live, agent_running, segment_gone, bad_weights); the Go
    agent uses the same codes."""

    def __init__(self, code: str, detail: str, path: str = "") -> None:
        self.code = code
        self.detail = detail
        self.path = path
        if code in FILE_CODES:  # about a weights, trace or scenario file: no segment to name
            super().__init__(f"{path + ': ' if path else ''}{code}: {detail}")
        else:
            super().__init__(f"mpib shm {path or '(buffer)'}: {code}: {detail}")


# The codes of errors in the files other than a segment that the agent reads.
FILE_CODES = frozenset({"bad_weights", "bad_trace", "bad_scenario"})


class GenerationChanged(SegmentError):
    """A slot hint was refused: the slot no longer holds the registration (generation) the
    caller read, i.e. that connection closed and the slot may hold another one."""

    def __init__(self, slot: int, expected: int, current: int, path: str = "") -> None:
        self.slot = slot
        self.expected = expected
        self.current = current
        super().__init__(
            "gen_changed",
            f"slot {slot}: the hint was meant for generation {expected}, the slot now holds "
            f"generation {current} (that connection closed)",
            path,
        )


class HintClampedWarning(UserWarning):
    """A hint above 1024 was written as 1024."""

    def __init__(self, requested: int, applied: int) -> None:
        self.requested = requested
        self.applied = applied
        super().__init__(f"sup_bw {requested} out of range 0..1024: clamped to {applied}")


def rail_state_name(v: int) -> str:
    """A rail state as both agents print it: up, down, failed, or unknown(N)."""
    return RAIL_STATES[v] if 0 <= v < len(RAIL_STATES) else f"unknown({v})"


def rail_state_value(s: str) -> int:
    """The inverse of rail_state_name; raises ValueError."""
    if s in RAIL_STATES:
        return RAIL_STATES.index(s)
    if s.startswith("unknown(") and s.endswith(")"):
        n = s[len("unknown(") : -1]
        if n.isascii() and n.isdigit() and 0 <= int(n) <= 0xFF and rail_state_name(int(n)) == s:
            return int(n)
    raise ValueError(f"rail state {s!r}: want up, down, failed or unknown(N)")


def nic_name(b: Union[bytes, bytearray, memoryview]) -> str:
    """A NIC name field as both agents show it (spec 4.3): the bytes before the first NUL (all
    of them when there is none), each byte outside 0x21..0x7e as '?', so that a garbage name
    can break neither a table line nor a JSON document."""
    raw = bytes(b)
    end = raw.find(0)
    return "".join(chr(c) if 0x21 <= c <= 0x7E else "?" for c in (raw if end < 0 else raw[:end]))


def nic_name_bytes(name: str) -> bytes:
    """A NIC name field's bytes: ``name`` in ASCII (other characters as '?'), cut to
    NIC_NAME - 1 bytes and NUL-padded, so that a NUL always ends it."""
    return name.encode("ascii", "replace")[: NIC_NAME - 1].ljust(NIC_NAME, b"\0")


def sup_path_name(p: int) -> str:
    """How a connection's SUP QPs reach the peer (slot sup_path), as both CLIs print it."""
    return SUP_PATHS.get(p, f"unknown({p})")


def class_name(c: int) -> str:
    """Path class as both CLIs print it."""
    return {0: "intra", 1: "inter"}.get(c, "invalid")


def integer(v: object) -> Optional[int]:
    """``v`` as an int when it is an integer of any kind user code may hold (int, a numpy
    integer: numbers.Integral), None otherwise; a bool is not an integer here."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        return None
    return operator.index(v)


def ip_str(v: int) -> str:
    return str(ipaddress.IPv4Address(v))


def ip_int(s: Union[str, int]) -> int:
    return s if isinstance(s, int) else int(ipaddress.IPv4Address(s))


@dataclass
class Record:
    """A hint record: slot hint, peer entry or class default."""

    seq: int = 0
    sup_bw: int = 0
    flags: int = 0
    gen: int = 0
    set_ns: int = 0
    peer_ip: str = "0.0.0.0"
    prefix_len: int = 0

    @property
    def valid(self) -> bool:
        return bool(self.flags & FLAG_VALID)


@dataclass
class Header:
    version: int = VERSION
    total_size: int = 0
    nslots: int = 0
    npeers: int = 0
    flags: int = 0
    heartbeat_ns: int = 0
    agent_pid: int = 0
    peers_epoch: int = 0
    created_ns: int = 0


@dataclass
class Telemetry:
    sout_bytes: int = 0
    sout_requests: int = 0
    sup_bytes: int = 0
    sup_requests: int = 0
    reads_applied: int = 0
    reads_fallback: int = 0
    reads_stale: int = 0
    clamped: int = 0
    last_sup_bw: int = 0
    last_source: int = 0
    last_read_ns: int = 0
    # rail states (spec 4.3): a rail leaves service (failover) and rejoins it
    sout_state: str = "up"  # up, down, failed, unknown(N)
    sup_state: str = "up"
    failovers: int = 0  # times a rail of this connection left service
    recoveries: int = 0  # times a rail came back into service
    sout_state_ns: int = 0  # CLOCK_REALTIME ns of the last sout_state change, 0 never
    sup_state_ns: int = 0
    # completion telemetry (spec 4.3): throughput = d(*_completed_bytes)/dt, mean completion latency =
    # d(*_busy_ns)/d(*_completed_requests) between two samples of the same gen
    applied_sup_bw: int = 0  # split of the last posted message, after the guard and failover
    flush_wall_ns: int = 0  # CLOCK_REALTIME ns of the plugin's last telemetry flush, 0 never
    sout_completed_bytes: int = 0
    sout_completed_requests: int = 0
    sout_inflight_bytes: int = 0  # gauge: posted on SOUT, not completed yet
    sout_busy_ns: int = 0  # sum of completion - post time over sout_completed_requests
    sup_completed_bytes: int = 0
    sup_completed_requests: int = 0
    sup_inflight_bytes: int = 0
    sup_busy_ns: int = 0
    # active time: ns with at least one of the connection's requests in flight on the rail;
    # d(*_completed_bytes)/d(*_active_ns) is what the rail delivers while it has work (its
    # capacity for this connection when it is the bottleneck)
    sout_active_ns: int = 0
    sup_active_ns: int = 0


@dataclass
class Slot:
    """One connection slot: descriptor, hint and telemetry."""

    index: int = 0
    state: int = STATE_FREE
    owner_pid: int = 0
    gen: int = 0
    conn_id: int = 0
    local_sout_ip: str = "0.0.0.0"
    peer_sout_ip: str = "0.0.0.0"
    peer_island: str = "0.0.0.0"
    path_class: int = 0
    is_send: int = 0
    nqps_sout: int = 0
    nqps_sup: int = 0
    pid: int = 0
    registered_ns: int = 0
    # the plugin's fused device (NCCL's device index) and its NICs (spec 4.3)
    dev: int = 0
    sout_port: int = 0  # 1-based
    sup_port: int = 0
    sup_path: int = 0  # how SUP reaches the peer: 0 none, 1 direct, 2 routed, 3 island (sup_path_name)
    sout_nic: str = ""  # verbs device name, as nic_name() shows it
    sup_nic: str = ""
    hint: Record = field(default_factory=Record)
    telemetry: Telemetry = field(default_factory=Telemetry)


@dataclass
class Peer:
    index: int = 0
    record: Record = field(default_factory=Record)


@dataclass
class Snapshot:
    """A whole decoded segment; slots/peers list only entries with a non-zero byte."""

    header: Header = field(default_factory=Header)
    class_defaults: List[Record] = field(default_factory=lambda: [Record(), Record()])
    peers: List[Peer] = field(default_factory=list)
    slots: List[Slot] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Snapshot":
        return cls(
            header=Header(**d["header"]),
            class_defaults=[Record(**r) for r in d["class_defaults"]],
            peers=[Peer(index=p["index"], record=Record(**p["record"])) for p in d["peers"]],
            slots=[_slot_from_dict(s) for s in d["slots"]],
        )


def _slot_from_dict(d: Dict[str, Any]) -> Slot:
    kw = {f.name: d[f.name] for f in fields(Slot) if f.name not in ("hint", "telemetry")}
    return Slot(**kw, hint=Record(**d["hint"]), telemetry=Telemetry(**d["telemetry"]))


@dataclass(frozen=True)
class Resolution:
    """What the plugin decides for a slot (spec 5.3)."""

    applies: bool
    sup_bw: int
    source: str
    clamped: bool = False
