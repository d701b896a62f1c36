"""Layout, decoding, encoding and hint resolution of the segment (docs/shm-format.md, v6)."""

from __future__ import annotations

import ipaddress
import mmap
import struct
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

MAGIC = b"MPIBHINT"
VERSION = 6
HEADER_SIZE = 256
SLOT_SIZE = 384
PEER_SIZE = 64
REC_SIZE = 64
MAX_SLOTS = 65536
MAX_PEERS = 4096
SUP_BW_MAX = 1024
SEQ_ATTEMPTS = 8
FLAG_VALID = 1
DEFAULT_PATH_PREFIX = "/dev/shm/mpib-hints-"  # + the effective uid: one segment per user
DEFAULT_STALE_MS = 500
MAX_STALE_MS = 3600000
LOCK_ATTACH = 0  # lock bytes (spec 5.7): shared by attached plugins
LOCK_AGENT = 1  # exclusive: the one beating agent

STATE_FREE, STATE_CLAIMING, STATE_ACTIVE = 0, 1, 2
SOURCES = ("no_hint", "slot", "peer", "class", "stale", "inactive", "busy", "bad_slot")

# header
OFF_VERSION, OFF_HEADER_SIZE, OFF_TOTAL, OFF_NSLOTS = 8, 12, 16, 24
OFF_SLOT_SIZE, OFF_NPEERS, OFF_PEER_SIZE, OFF_FLAGS = 28, 32, 36, 40
OFF_HEARTBEAT, OFF_AGENT_PID, OFF_PEERS_EPOCH, OFF_CREATED = 64, 72, 76, 80
OFF_CLASS = 128
# hint record (relative)
R_SEQ, R_SUP_BW, R_FLAGS, R_GEN, R_SET_NS, R_PEER_IP, R_PREFIX = 0, 4, 8, 12, 16, 24, 28
# slot (relative)
S_OWNER, S_GEN, S_CONN, S_LOCAL, S_PEER, S_ISLAND = 0, 8, 16, 24, 28, 32
S_CLASS, S_SEND, S_QSOUT, S_QSUP, S_PID, S_REG, S_HINT = 36, 37, 38, 40, 44, 48, 64
# version 4: the connection's fused device (u16), its NICs' ports (u8 each) and names
S_DEV, S_SOUT_PORT, S_SUP_PORT = 42, 56, 57
S_SUP_PATH = 58  # version 6: how SUP reaches the peer (SUP_PATHS)
S_SOUT_NIC, S_SUP_NIC = 336, 360  # char[NIC_NAME] each, NUL-padded, NUL-terminated
NIC_NAME = 24
TELEMETRY: Tuple[Tuple[str, int, int], ...] = (
    ("sout_bytes", 128, 8),
    ("sout_requests", 136, 8),
    ("sup_bytes", 144, 8),
    ("sup_requests", 152, 8),
    ("reads_applied", 160, 8),
    ("reads_fallback", 168, 8),
    ("reads_stale", 176, 8),
    ("clamped", 184, 8),
    ("last_sup_bw", 192, 4),
    ("last_source", 196, 4),
    ("last_read_ns", 200, 8),
    ("failovers", 212, 4),
    ("sout_state_ns", 216, 8),
    ("sup_state_ns", 224, 8),
    # version 3: the split applied, the last flush (CLOCK_REALTIME), per rail what completed
    ("applied_sup_bw", 232, 4),
    ("recoveries", 236, 4),  # version 5: times a rail came back into service
    ("flush_wall_ns", 240, 8),
    ("sout_completed_bytes", 256, 8),
    ("sout_completed_requests", 264, 8),
    ("sout_inflight_bytes", 272, 8),  # a gauge
    ("sout_busy_ns", 280, 8),
    ("sup_completed_bytes", 288, 8),
    ("sup_completed_requests", 296, 8),
    ("sup_inflight_bytes", 304, 8),
    ("sup_busy_ns", 312, 8),
    ("sout_active_ns", 320, 8),  # time with a request in flight on the rail
    ("sup_active_ns", 328, 8),
)
S_TELEMETRY = 128  # telemetry spans [S_TELEMETRY, S_TELEMETRY_END): zeroed at each claim
S_TELEMETRY_END = S_SOUT_NIC  # the NIC names after it are descriptor fields (version 4)
# rail states (u8 each): field name, offset; JSON and the dataclass hold rail_state_name()
RAIL_STATE_FIELDS: Tuple[Tuple[str, int], ...] = (("sout_state", 208), ("sup_state", 209))
RAIL_STATES = ("up", "down", "failed")  # 0 in service, 1 out after a failover, 2 device gone

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("mpib_agent: the hint segment is little-endian and accessed in place")


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
        super().__init__(f"mpib shm {path or '(buffer)'}: {code}: {detail}")


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
        n = s[len("unknown("):-1]
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


def total_size(nslots: int, npeers: int) -> int:
    return HEADER_SIZE + nslots * SLOT_SIZE + npeers * PEER_SIZE


def slot_off(i: int) -> int:
    return HEADER_SIZE + i * SLOT_SIZE


def peer_off(nslots: int, j: int) -> int:
    return HEADER_SIZE + nslots * SLOT_SIZE + j * PEER_SIZE


def class_off(c: int) -> int:
    return OFF_CLASS + c * REC_SIZE


def ip_str(v: int) -> str:
    return str(ipaddress.IPv4Address(v))


def ip_int(s: Union[str, int]) -> int:
    return s if isinstance(s, int) else int(ipaddress.IPv4Address(s))


Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]


class View:
    """Little-endian fields of a segment image in memory (bytes, bytearray). The live segment
    is accessed through ``FileView`` (``_segment.py``) instead: never a mapping."""

    def __init__(self, buf: Buffer) -> None:
        self.mv = memoryview(buf).cast("B")

    def release(self) -> None:
        self.mv.release()

    def region(self, off: int, n: int) -> Tuple["View", int]:
        """A view holding bytes [off, off+n) and the offset of off in it."""
        return self, off

    def read(self, off: int, n: int) -> bytes:
        return bytes(self.mv[off : off + n])

    def write(self, off: int, b: bytes) -> None:
        self.mv[off : off + len(b)] = b

    def u8(self, off: int) -> int:
        return int(self.mv[off])

    def u16(self, off: int) -> int:
        v: int = struct.unpack_from("<H", self.mv, off)[0]
        return v

    def u32(self, off: int) -> int:
        v: int = struct.unpack_from("<I", self.mv, off)[0]
        return v

    def u64(self, off: int) -> int:
        v: int = struct.unpack_from("<Q", self.mv, off)[0]
        return v

    def put8(self, off: int, v: int) -> None:
        self.mv[off] = v & 0xFF

    def put16(self, off: int, v: int) -> None:
        struct.pack_into("<H", self.mv, off, v & 0xFFFF)

    def put32(self, off: int, v: int) -> None:
        struct.pack_into("<I", self.mv, off, v & 0xFFFFFFFF)

    def put64(self, off: int, v: int) -> None:
        struct.pack_into("<Q", self.mv, off, v & 0xFFFFFFFFFFFFFFFF)

    def raw_record(self, off: int) -> "Record":
        return record_from(struct.unpack_from(REC_FMT, self.mv, off))

    def read_record(self, off: int) -> Tuple["Record", bool]:
        """An image is read once: (record, consistent) where an odd seq is inconsistent."""
        r = self.raw_record(off)
        return r, not r.seq & 1

    def write_fields(self, off: int, r: "Record") -> None:
        struct.pack_into(REC_FIELDS_FMT, self.mv, off + R_SUP_BW, *record_fields(r))

    def write_record(self, off: int, r: "Record") -> None:
        w = self.u32(off + R_SEQ) | 1
        self.put32(off + R_SEQ, w)
        self.write_fields(off, r)
        self.put32(off + R_SEQ, w + 1)


REC_FMT = "<IIIIQIB"  # seq, sup_bw, flags, gen, set_ns, peer_ip, prefix_len (29 bytes)
REC_FIELDS_FMT = "<IIIQIB"  # the same without seq, from offset +4 (25 bytes)


def record_from(t: Tuple[int, ...]) -> "Record":
    return Record(seq=t[0], sup_bw=t[1], flags=t[2], gen=t[3], set_ns=t[4], peer_ip=ip_str(t[5]), prefix_len=t[6])


def record_fields(r: "Record") -> Tuple[int, ...]:
    return (r.sup_bw & 0xFFFFFFFF, r.flags & 0xFFFFFFFF, r.gen & 0xFFFFFFFF, r.set_ns & 0xFFFFFFFFFFFFFFFF,
            ip_int(r.peer_ip), r.prefix_len & 0xFF)


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
    recoveries: int = 0  # times a rail came back into service (version 5)
    sout_state_ns: int = 0  # CLOCK_REALTIME ns of the last sout_state change, 0 never
    sup_state_ns: int = 0
    # version 3 (spec 4.3): throughput = d(*_completed_bytes)/dt, mean completion latency =
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
    # version 4: the plugin's fused device (NCCL's device index) and its NICs (spec 4.3)
    dev: int = 0
    sout_port: int = 0  # 1-based
    sup_port: int = 0
    sup_path: int = 0  # version 6: 0 none, 1 direct, 2 routed, 3 island (sup_path_name)
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


def _fail(code: str, detail: str, path: str) -> SegmentError:
    return SegmentError(code, detail, path)


def validate_header(head: Buffer, size: int, path: str = "") -> Header:
    """Checks 5..9 of the spec's validation table; ``head`` holds the first bytes of a file
    of ``size`` bytes."""
    hb = bytes(head[:HEADER_SIZE])
    if size < HEADER_SIZE or len(hb) < HEADER_SIZE:
        raise _fail("too_small", f"{size} bytes, a header needs {HEADER_SIZE}", path)
    if hb[:8] != MAGIC:
        raise _fail("bad_magic", "not an MPIB hint segment", path)
    v = View(hb)
    ver = v.u32(OFF_VERSION)
    if ver != VERSION:
        advice = ("a segment made by an older agent: re-create it with the current agent" if ver < VERSION
                  else "a segment made by a newer agent: upgrade the plugin and agents")
        raise _fail("bad_version", f"format version {ver}, this reader implements {VERSION} ({advice})", path)
    h = decode_header(v)
    hs, ss, ps = v.u32(OFF_HEADER_SIZE), v.u32(OFF_SLOT_SIZE), v.u32(OFF_PEER_SIZE)
    if (
        hs != HEADER_SIZE
        or ss != SLOT_SIZE
        or ps != PEER_SIZE
        or not 1 <= h.nslots <= MAX_SLOTS
        or h.npeers > MAX_PEERS
        or h.total_size != total_size(h.nslots, h.npeers)
    ):
        raise _fail(
            "bad_geometry",
            f"header_size={hs} slot_size={ss} peer_size={ps} nslots={h.nslots} "
            f"npeers={h.npeers} total_size={h.total_size}",
            path,
        )
    if size < h.total_size:
        raise _fail("too_small", f"{size} bytes, the header declares {h.total_size}", path)
    return h


def decode_header(v: Any) -> Header:
    return Header(
        version=v.u32(OFF_VERSION),
        total_size=v.u64(OFF_TOTAL),
        nslots=v.u32(OFF_NSLOTS),
        npeers=v.u32(OFF_NPEERS),
        flags=v.u32(OFF_FLAGS),
        heartbeat_ns=v.u64(OFF_HEARTBEAT),
        agent_pid=v.u32(OFF_AGENT_PID),
        peers_epoch=v.u32(OFF_PEERS_EPOCH),
        created_ns=v.u64(OFF_CREATED),
    )


def decode_slot(v: Any, i: int, hint: Optional[Record] = None) -> Slot:
    off = slot_off(i)
    owner = v.u64(off + S_OWNER)
    counters: Dict[str, Any] = {
        name: (v.u64(off + o) if size == 8 else v.u32(off + o)) for name, o, size in TELEMETRY
    }
    rails: Dict[str, Any] = {name: rail_state_name(v.u8(off + o)) for name, o in RAIL_STATE_FIELDS}
    tel = Telemetry(**counters, **rails)
    return Slot(
        index=i,
        state=owner & 0xFFFFFFFF,
        owner_pid=owner >> 32,
        gen=v.u32(off + S_GEN),
        conn_id=v.u64(off + S_CONN),
        local_sout_ip=ip_str(v.u32(off + S_LOCAL)),
        peer_sout_ip=ip_str(v.u32(off + S_PEER)),
        peer_island=ip_str(v.u32(off + S_ISLAND)),
        path_class=v.u8(off + S_CLASS),
        is_send=v.u8(off + S_SEND),
        nqps_sout=v.u16(off + S_QSOUT),
        nqps_sup=v.u16(off + S_QSUP),
        pid=v.u32(off + S_PID),
        registered_ns=v.u64(off + S_REG),
        dev=v.u16(off + S_DEV),
        sout_port=v.u8(off + S_SOUT_PORT),
        sup_port=v.u8(off + S_SUP_PORT),
        sup_path=v.u8(off + S_SUP_PATH),
        sout_nic=nic_name(v.read(off + S_SOUT_NIC, NIC_NAME)),
        sup_nic=nic_name(v.read(off + S_SUP_NIC, NIC_NAME)),
        hint=hint if hint is not None else v.raw_record(off + S_HINT),
        telemetry=tel,
    )


def _nonzero(v: View, off: int, n: int) -> bool:
    return any(v.mv[off : off + n])


def decode_view(v: View, h: Header) -> Snapshot:
    snap = Snapshot(header=h, class_defaults=[v.raw_record(class_off(0)), v.raw_record(class_off(1))])
    for j in range(h.npeers):
        off = peer_off(h.nslots, j)
        if _nonzero(v, off, PEER_SIZE):
            snap.peers.append(Peer(index=j, record=v.raw_record(off)))
    for i in range(h.nslots):
        if _nonzero(v, slot_off(i), SLOT_SIZE):
            snap.slots.append(decode_slot(v, i))
    return snap


def decode(buf: Buffer) -> Snapshot:
    """Validates and decodes a segment image; raises SegmentError."""
    h = validate_header(buf, len(buf))
    v = View(memoryview(buf)[: h.total_size])
    try:
        return decode_view(v, h)
    finally:
        v.release()


def _put_record(v: Any, off: int, r: Record) -> None:
    v.put32(off + R_SEQ, r.seq)
    v.write_fields(off, r)


def encode(snap: Snapshot) -> bytes:
    """The image of ``snap``; bytes it does not describe are zero."""
    h = snap.header
    if not 1 <= h.nslots <= MAX_SLOTS or not 0 <= h.npeers <= MAX_PEERS:
        raise SegmentError("bad_geometry", f"nslots={h.nslots} npeers={h.npeers}")
    buf = bytearray(total_size(h.nslots, h.npeers))
    v = View(buf)
    buf[:8] = MAGIC
    v.put32(OFF_VERSION, h.version)
    v.put32(OFF_HEADER_SIZE, HEADER_SIZE)
    v.put64(OFF_TOTAL, h.total_size)
    v.put32(OFF_NSLOTS, h.nslots)
    v.put32(OFF_SLOT_SIZE, SLOT_SIZE)
    v.put32(OFF_NPEERS, h.npeers)
    v.put32(OFF_PEER_SIZE, PEER_SIZE)
    v.put32(OFF_FLAGS, h.flags)
    v.put64(OFF_HEARTBEAT, h.heartbeat_ns)
    v.put32(OFF_AGENT_PID, h.agent_pid)
    v.put32(OFF_PEERS_EPOCH, h.peers_epoch)
    v.put64(OFF_CREATED, h.created_ns)
    for c, r in enumerate(snap.class_defaults[:2]):
        _put_record(v, class_off(c), r)
    for p in snap.peers:
        if not 0 <= p.index < h.npeers:
            raise SegmentError("slot_range", f"peer index {p.index} of {h.npeers}")
        _put_record(v, peer_off(h.nslots, p.index), p.record)
    for s in snap.slots:
        if not 0 <= s.index < h.nslots:
            raise SegmentError("slot_range", f"slot index {s.index} of {h.nslots}")
        encode_slot(v, s)
    v.release()
    return bytes(buf)


def encode_slot(v: Any, s: Slot) -> None:
    off = slot_off(s.index)
    v.put64(off + S_OWNER, s.state | s.owner_pid << 32)
    v.put32(off + S_GEN, s.gen)
    v.put64(off + S_CONN, s.conn_id)
    v.put32(off + S_LOCAL, ip_int(s.local_sout_ip))
    v.put32(off + S_PEER, ip_int(s.peer_sout_ip))
    v.put32(off + S_ISLAND, ip_int(s.peer_island))
    v.put8(off + S_CLASS, s.path_class)
    v.put8(off + S_SEND, s.is_send)
    v.put16(off + S_QSOUT, s.nqps_sout)
    v.put16(off + S_QSUP, s.nqps_sup)
    v.put32(off + S_PID, s.pid)
    v.put64(off + S_REG, s.registered_ns)
    put_device(v, off, s.dev, s.sout_port, s.sup_port, s.sout_nic, s.sup_nic)
    v.put8(off + S_SUP_PATH, s.sup_path)
    _put_record(v, off + S_HINT, s.hint)
    put_telemetry(v, off, s.telemetry)


def put_device(v: Any, off: int, dev: int, sout_port: int, sup_port: int, sout_nic: str, sup_nic: str) -> None:
    """The version 4 descriptor fields of the slot at ``off``: device, ports, NIC names."""
    v.put16(off + S_DEV, dev)
    v.put8(off + S_SOUT_PORT, sout_port)
    v.put8(off + S_SUP_PORT, sup_port)
    v.write(off + S_SOUT_NIC, nic_name_bytes(sout_nic))
    v.write(off + S_SUP_NIC, nic_name_bytes(sup_nic))


def put_telemetry(v: Any, off: int, t: Telemetry) -> None:
    for name, o, size in TELEMETRY:
        (v.put64 if size == 8 else v.put32)(off + o, getattr(t, name))
    for name, o in RAIL_STATE_FIELDS:
        v.put8(off + o, rail_state_value(getattr(t, name)))


SUP_PATHS = {0: "none", 1: "direct", 2: "routed", 3: "island"}


def sup_path_name(p: int) -> str:
    """How a connection's SUP QPs reach the peer (slot sup_path), as both CLIs print it."""
    return SUP_PATHS.get(p, f"unknown({p})")


def class_name(c: int) -> str:
    """Path class as both CLIs print it."""
    return {0: "intra", 1: "inter"}.get(c, "invalid")


def clamp(v: int) -> Tuple[int, bool]:
    return (SUP_BW_MAX, True) if v > SUP_BW_MAX else (max(v, 0), False)


def heartbeat_fresh(hb: int, now: int, stale_ns: int) -> bool:
    if hb == 0:
        return False
    if now >= hb:
        return now - hb <= stale_ns
    return hb - now <= stale_ns


def prefix_match(ip: int, key: int, prefix_len: int) -> bool:
    if prefix_len > 32:
        return False
    mask = 0 if prefix_len == 0 else (0xFFFFFFFF << (32 - prefix_len)) & 0xFFFFFFFF
    return (ip & mask) == (key & mask)


def _applied(v: int, source: str) -> Resolution:
    c, clamped = clamp(v)
    return Resolution(True, c, source, clamped)


def _none(reason: str) -> Resolution:
    return Resolution(False, 0, reason, False)


def peer_scan(v: Any, h: Header, ip: int) -> Optional[int]:
    """Longest valid matching prefix (ties: lowest index); entries caught mid-write are
    skipped. The entries are read in one piece (``region``), the chosen one again by the
    caller under its seqlock."""
    best, best_len = None, -1
    pv, base = v.region(peer_off(h.nslots, 0), h.npeers * PEER_SIZE)
    for j in range(h.npeers):
        r, ok = pv.read_record(base + j * PEER_SIZE)
        if not ok or not r.valid:
            continue
        if prefix_match(ip, ip_int(r.peer_ip), r.prefix_len) and r.prefix_len > best_len:
            best, best_len = j, r.prefix_len
    return best


RecordReader = Callable[[int], Tuple[Record, bool]]
PeerStep = Callable[[int, int, int], Optional[Resolution]]


def resolve_view(v: Any, h: Header, slot: int, now: int, stale_ns: int,
                 read: Optional[RecordReader] = None, peer: Optional[PeerStep] = None) -> Resolution:
    """Spec 5.3. ``read`` (offset -> (record, consistent)) and ``peer`` (slot, gen, peer ip ->
    step 5's resolution, or None when no entry applies) replace the plain seqlock read and the
    peer table scan: the simulator's cached reader (_hintcache.py) passes its own."""
    read_rec: RecordReader = read or v.read_record
    if not 0 <= slot < h.nslots:
        return _none("bad_slot")
    if not heartbeat_fresh(v.u64(OFF_HEARTBEAT), now, stale_ns):
        return _none("stale")
    off = slot_off(slot)
    if v.u64(off + S_OWNER) & 0xFFFFFFFF != STATE_ACTIVE:
        return _none("inactive")
    gen = v.u32(off + S_GEN)
    r, ok = read_rec(off + S_HINT)
    if not ok:
        return _none("busy")
    if r.valid and r.gen == gen:
        return _applied(r.sup_bw, "slot")
    ip = v.u32(off + S_PEER)
    res = peer(slot, gen, ip) if peer is not None else _peer_step(v, h, ip, read_rec)
    if res is not None:
        return res
    c = v.u8(off + S_CLASS)
    if c <= 1:
        r, ok = read_rec(class_off(c))
        if not ok:
            return _none("busy")
        if r.valid:
            return _applied(r.sup_bw, "class")
    return _none("no_hint")


def _peer_step(v: Any, h: Header, ip: int, read_rec: RecordReader) -> Optional[Resolution]:
    """Step 5 by a scan of the peer table: the matching entry's hint, ``busy``, or None."""
    j = peer_scan(v, h, ip)
    if j is None:
        return None
    r, ok = read_rec(peer_off(h.nslots, j))
    if not ok:
        return _none("busy")
    if r.valid and prefix_match(ip, ip_int(r.peer_ip), r.prefix_len):
        return _applied(r.sup_bw, "peer")
    return None


def resolve(buf: Buffer, slot: int, now_ns: int, stale_ns: int) -> Resolution:
    """Resolves a slot of a segment image at an explicit time (the vectors' reads)."""
    h = validate_header(buf, len(buf))
    v = View(memoryview(buf)[: h.total_size])
    try:
        return resolve_view(v, h, slot, now_ns, stale_ns)
    finally:
        v.release()
