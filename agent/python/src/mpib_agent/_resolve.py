"""Hint resolution (spec 5.3): what the plugin decides for a slot, from a segment image or a
live view."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from ._codec import Buffer, View, validate_header
from ._layout import (
    OFF_HEARTBEAT,
    PEER_SIZE,
    S_CLASS,
    S_GEN,
    S_HINT,
    S_OWNER,
    S_PEER,
    STATE_ACTIVE,
    SUP_BW_MAX,
    class_off,
    peer_off,
    slot_off,
)
from ._types import Header, Record, Resolution, ip_int


def clamp(v: int) -> Tuple[int, bool]:
    return (SUP_BW_MAX, True) if v > SUP_BW_MAX else (max(v, 0), False)


def heartbeat_fresh(hb: int, now: int, stale_ns: int) -> bool:
    if hb == 0:
        return False
    if now >= hb:
        return now - hb <= stale_ns
    return hb - now <= stale_ns


def prefix_mask(prefix_len: int) -> int:
    """The mask of a prefix of prefix_len bits, 0..32."""
    return 0 if prefix_len == 0 else (0xFFFFFFFF << (32 - prefix_len)) & 0xFFFFFFFF


def prefix_match(ip: int, key: int, prefix_len: int) -> bool:
    if prefix_len > 32:
        return False
    mask = prefix_mask(prefix_len)
    return (ip & mask) == (key & mask)


def _applied(v: int, source: str) -> Resolution:
    c, clamped = clamp(v)
    return Resolution(True, c, source, clamped)


def _none(reason: str) -> Resolution:
    return Resolution(False, 0, reason, False)


def peer_scan(v: Any, h: Header, ip: int) -> Tuple[Optional[int], bool]:
    """(longest valid matching prefix or None, complete): ties go to the lowest index; entries
    caught mid-write are skipped, and a scan that skipped one is not complete (spec 5.3: the
    skipped entry may be the match, or a longer one, so its result must not be cached). The
    entries are read in one piece (``region``), the chosen one again by the caller under its
    seqlock."""
    best, best_len, complete = None, -1, True
    pv, base = v.region(peer_off(h.nslots, 0), h.npeers * PEER_SIZE)
    for j in range(h.npeers):
        r, ok = pv.read_record(base + j * PEER_SIZE)
        if not ok:
            complete = False
            continue
        if r.valid and prefix_match(ip, ip_int(r.peer_ip), r.prefix_len) and r.prefix_len > best_len:
            best, best_len = j, r.prefix_len
    return best, complete


RecordReader = Callable[[int], Tuple[Record, bool]]
PeerStep = Callable[[int, int, int], Optional[Resolution]]


def resolve_view(
    v: Any,
    h: Header,
    slot: int,
    now: int,
    stale_ns: int,
    read: Optional[RecordReader] = None,
    peer: Optional[PeerStep] = None,
) -> Resolution:
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
    j, _ = peer_scan(v, h, ip)
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
