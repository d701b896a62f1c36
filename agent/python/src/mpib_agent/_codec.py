"""Encoding and decoding of segment images, and the View that reads and writes fields of an
image in memory (the live segment uses _segfile.FileView instead)."""

from __future__ import annotations

import mmap
import struct
from typing import Any, Dict, Optional, Tuple, Union

from ._layout import (
    HEADER_SIZE,
    MAGIC,
    MAX_PEERS,
    MAX_SLOTS,
    NIC_NAME,
    OFF_AGENT_PID,
    OFF_CREATED,
    OFF_FLAGS,
    OFF_HEADER_SIZE,
    OFF_HEARTBEAT,
    OFF_NPEERS,
    OFF_NSLOTS,
    OFF_PEER_SIZE,
    OFF_PEERS_EPOCH,
    OFF_SLOT_SIZE,
    OFF_TOTAL,
    OFF_VERSION,
    PEER_SIZE,
    R_SEQ,
    R_SUP_BW,
    RAIL_STATE_FIELDS,
    REC_FIELDS_FMT,
    REC_FMT,
    S_CLASS,
    S_CONN,
    S_DEV,
    S_GEN,
    S_HINT,
    S_ISLAND,
    S_LOCAL,
    S_OWNER,
    S_PEER,
    S_PID,
    S_QSOUT,
    S_QSUP,
    S_REG,
    S_SEND,
    S_SOUT_NIC,
    S_SOUT_PORT,
    S_SUP_NIC,
    S_SUP_PATH,
    S_SUP_PORT,
    SLOT_SIZE,
    TELEMETRY,
    VERSION,
    class_off,
    peer_off,
    slot_off,
    total_size,
)
from ._types import (
    Header,
    Peer,
    Record,
    SegmentError,
    Slot,
    Snapshot,
    Telemetry,
    ip_int,
    ip_str,
    nic_name,
    nic_name_bytes,
    rail_state_name,
    rail_state_value,
)

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]


class View:
    """Little-endian fields of a segment image in memory (bytes, bytearray). The live segment
    is accessed through ``FileView`` (``_segfile.py``) instead: never a mapping."""

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

    def raw_record(self, off: int) -> Record:
        return record_from(struct.unpack_from(REC_FMT, self.mv, off))

    def read_record(self, off: int) -> Tuple[Record, bool]:
        """An image is read once: (record, consistent) where an odd seq is inconsistent."""
        r = self.raw_record(off)
        return r, not r.seq & 1

    def write_fields(self, off: int, r: Record) -> None:
        struct.pack_into(REC_FIELDS_FMT, self.mv, off + R_SUP_BW, *record_fields(r))

    def write_record(self, off: int, r: Record) -> None:
        w = self.u32(off + R_SEQ) | 1
        self.put32(off + R_SEQ, w)
        self.write_fields(off, r)
        self.put32(off + R_SEQ, w + 1)


def record_from(t: Tuple[int, ...]) -> Record:
    return Record(seq=t[0], sup_bw=t[1], flags=t[2], gen=t[3], set_ns=t[4], peer_ip=ip_str(t[5]), prefix_len=t[6])


def record_fields(r: Record) -> Tuple[int, ...]:
    return (
        r.sup_bw & 0xFFFFFFFF,
        r.flags & 0xFFFFFFFF,
        r.gen & 0xFFFFFFFF,
        r.set_ns & 0xFFFFFFFFFFFFFFFF,
        ip_int(r.peer_ip),
        r.prefix_len & 0xFF,
    )


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
        advice = (
            "a segment made by an older agent: re-create it with the current agent"
            if ver < VERSION
            else "a segment made by a newer agent: upgrade the plugin and agents"
        )
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
    counters: Dict[str, Any] = {name: (v.u64(off + o) if size == 8 else v.u32(off + o)) for name, o, size in TELEMETRY}
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
    """The device descriptor fields of the slot at ``off``: device, ports, NIC names."""
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
