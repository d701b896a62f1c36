"""The live segment (spec sections 5 and 6), read and written through its file descriptor.

Python never maps the segment: a mapped file that someone truncates raises SIGBUS at the next
access, which no Python code can survive. Every field is read with one ``os.pread`` and
written with one ``os.pwrite`` of its size at its aligned offset, so a truncated segment
gives a short read (``SegmentError("segment_gone")``), never a crash. Each system call
completes before the next starts, which gives the seqlock its order (spec 5.1).

The file under a ``Segment`` (its locks, its ``FileView``, liveness, the checks before an open
and the writing of a new file) is ``_segfile``'s; this module re-exports the public names.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import warnings
from contextlib import contextmanager
from typing import Iterator, List, Optional, Union

from ._codec import View, decode_header, decode_slot, decode_view, validate_header
from ._layout import (
    FLAG_VALID,
    HEADER_SIZE,
    LOCK_AGENT,
    MAGIC,
    OFF_AGENT_PID,
    OFF_HEADER_SIZE,
    OFF_HEARTBEAT,
    OFF_PEER_SIZE,
    OFF_PEERS_EPOCH,
    OFF_SLOT_SIZE,
    PEER_SIZE,
    R_SEQ,
    S_GEN,
    S_HINT,
    S_OWNER,
    SLOT_SIZE,
    STATE_ACTIVE,
    class_off,
    peer_off,
    slot_off,
)
from ._resolve import clamp, heartbeat_fresh, prefix_mask, resolve_view
from ._segfile import (
    FileView,
    Liveness,
    _check_stat,
    _lock_byte,
    _lock_held,
    _new_file,
    _open_nonblocking,
    beat_period_s,
    default_path,
    liveness,
    now_ns,
    slot_lock_off,
    stale_ns_from_env,
)
from ._types import (
    GenerationChanged,
    Header,
    HintClampedWarning,
    Record,
    Resolution,
    SegmentError,
    Slot,
    Snapshot,
    integer,
    ip_int,
    ip_str,
)

_GC_CHUNK = 256  # slots per hold of the writer lock in gc()

_CLASSES = {"intra": 0, "inter": 1, "0": 0, "1": 1}


def parse_class(c: Union[str, int]) -> int:
    v = _CLASSES.get(str(c).lower())
    if v is None:
        raise SegmentError("bad_class", f"path class must be intra (0) or inter (1), got {c!r}")
    return v


# ---- the segment --------------------------------------------------------------------------


class Segment:
    """An open hint segment. Use :func:`open_segment` or :func:`create`; close it (or use it
    as a context manager) when done. Safe for use from several threads."""

    def __init__(self, path: str, fd: int, header: Header, st: os.stat_result) -> None:
        self.path = path
        self._fd = fd
        self._h = header
        self._v = FileView(fd, path, header.total_size)
        self._dev, self._ino = st.st_dev, st.st_ino
        # Every access holds _io; a writer holds it while it waits for the writer lock, which
        # another process may hold for long. The heartbeat takes only _swap, which reattach()
        # and close() take (inside _io) to swap or close the descriptor, so a beat never waits
        # for a writer (spec 5.2, 5.5).
        self._io = threading.RLock()
        self._swap = threading.Lock()
        self._agent = False
        self._last_beat = 0
        self._attachment = 0

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._io, self._swap:
            if self._fd < 0:
                return
            os.close(self._fd)  # drops this Segment's locks
            self._fd = -1

    @property
    def attachment(self) -> int:
        """Names the file this Segment reads: 0 for the one opened, one more after each
        reattach() that moved. Slot indices, generations and hints belong to one attachment: a
        writer that remembers what it wrote must forget it when this changes (the new segment
        holds none of it, and its generations start again at 1)."""
        return self._attachment

    @property
    def nslots(self) -> int:
        return self._h.nslots

    @property
    def npeers(self) -> int:
        return self._h.npeers

    def err(self) -> Optional[SegmentError]:
        """SegmentError("segment_gone") once the segment was truncated, else None."""
        return self._v._gone() if self._v.gone else None

    def header(self) -> Header:
        """The header with the live heartbeat and epoch."""
        with self._io:
            return decode_header(View(self._v.read(0, HEADER_SIZE)))

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """The writer lock (spec 5.5)."""
        with self._io:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _check_size(self) -> None:
        """Refuses to write into a truncated file (a pwrite would extend it)."""
        if os.fstat(self._fd).st_size < self._h.total_size:
            raise self._v._gone()

    # -- the agent lock and the heartbeat ---------------------------------------------------

    def acquire_agent(self) -> None:
        """Takes the agent lock (spec 5.7): one beating agent per segment. Raises
        SegmentError("agent_running") when another agent (Go or Python) holds it."""
        with self._io:
            if self._agent:
                return
            if not _lock_byte(self._fd, LOCK_AGENT, fcntl.F_WRLCK):
                pid = struct.unpack("<I", os.pread(self._fd, 4, OFF_AGENT_PID).ljust(4, b"\0"))[0]
                raise SegmentError(
                    "agent_running", f"pid {pid} runs a heartbeat or policy loop on it; stop it first", self.path
                )
            self._agent = True

    def release_agent(self) -> None:
        with self._io:
            if self._agent and self._fd >= 0:
                _lock_byte(self._fd, LOCK_AGENT, fcntl.F_UNLCK)
            self._agent = False

    def beat(self, now: Optional[int] = None) -> None:
        """Stores the heartbeat; hints apply only while it is fresh. Never waits for a writer:
        a heartbeat store needs no lock (spec 5.5)."""
        t = now_ns() if now is None else now
        with self._swap:
            self._check_size()
            self._v.put32(OFF_AGENT_PID, os.getpid())
            self._v.put64(OFF_HEARTBEAT, t)
            self._last_beat = t

    def stop_beat(self) -> bool:
        """Clean exit: plugins fall back to vanilla at once. Clears the heartbeat only if it is
        still the one this Segment stored (never another agent's); returns whether it did."""
        with self._swap:
            last, self._last_beat = self._last_beat, 0
            try:
                if last and self._v.u64(OFF_HEARTBEAT) == last:
                    self._v.put64(OFF_HEARTBEAT, 0)
                    return True
            except SegmentError:
                pass
            return False

    def agent_alive(self, stale_ns: Optional[int] = None) -> bool:
        st = stale_ns_from_env() if stale_ns is None else stale_ns
        return heartbeat_fresh(self.header().heartbeat_ns, now_ns(), st)

    # -- reading ----------------------------------------------------------------------------

    def _check_geometry(self, head: View) -> None:
        """Raises SegmentError("bad_geometry") when the header read (``head``) no longer
        describes the geometry validated at open: only a process writing garbage into the file
        does that. Readers keep using the validated geometry either way."""
        h, v = decode_header(head), self._h
        sizes = (head.u32(OFF_HEADER_SIZE), head.u32(OFF_SLOT_SIZE), head.u32(OFF_PEER_SIZE))
        if (
            head.read(0, len(MAGIC)) == MAGIC
            and sizes == (HEADER_SIZE, SLOT_SIZE, PEER_SIZE)
            and (h.version, h.nslots, h.npeers, h.total_size) == (v.version, v.nslots, v.npeers, v.total_size)
        ):
            return
        raise SegmentError(
            "bad_geometry",
            f"segment geometry changed since open (nslots {v.nslots} -> {h.nslots}, "
            f"npeers {v.npeers} -> {h.npeers}, total_size {v.total_size} -> {h.total_size}, "
            f"version {v.version} -> {h.version}): reopen",
            self.path,
        )

    def connections(self) -> List[Slot]:
        """Active slots, hints read under their seqlock; SegmentError("bad_geometry") when the
        header changed since open."""
        with self._io:
            n = self._h.nslots
            img = View(self._v.read(0, slot_off(n)))  # header and slots in one read
            self._check_geometry(img)
            out = []
            for i in range(n):
                off = slot_off(i)
                if img.u64(off + S_OWNER) & 0xFFFFFFFF == STATE_ACTIVE:
                    rec, _ = self._v.read_record(off + S_HINT)
                    out.append(decode_slot(img, i, rec))
            return out

    def slot(self, i: int) -> Slot:
        with self._io:
            self._check_slot(i)
            img = View(self._v.read(0, slot_off(i + 1)))
            rec, _ = self._v.read_record(slot_off(i) + S_HINT)
            return decode_slot(img, i, rec)

    def snapshot(self) -> Snapshot:
        """The whole segment, decoded with the geometry validated at open (one read);
        SegmentError("bad_geometry") when the header changed since open."""
        with self._io:
            img = View(self._v.read(0, self._h.total_size))
            self._check_geometry(img)
            h = decode_header(img)
            h.version, h.total_size, h.nslots, h.npeers = (
                self._h.version,
                self._h.total_size,
                self._h.nslots,
                self._h.npeers,
            )
            snap = decode_view(img, h)
            for p in snap.peers:
                p.record, _ = self._v.read_record(peer_off(self._h.nslots, p.index))
            for s in snap.slots:
                s.hint, _ = self._v.read_record(slot_off(s.index) + S_HINT)
            snap.class_defaults = [self._v.read_record(class_off(c))[0] for c in (0, 1)]
            return snap

    def resolve(self, slot: int, now: Optional[int] = None, stale_ns: Optional[int] = None) -> Resolution:
        """What the plugin would decide for ``slot`` now (spec 5.3)."""
        with self._io:
            return resolve_view(
                self._v,
                self._h,
                slot,
                now_ns() if now is None else now,
                stale_ns_from_env() if stale_ns is None else stale_ns,
            )

    # -- writing hints ----------------------------------------------------------------------

    def _check_slot(self, i: int) -> None:
        """Raises slot_range for an index beyond the segment; the caller holds ``_io``, since
        reattach() may swap in a segment with fewer slots."""
        if not 0 <= i < self._h.nslots:
            raise SegmentError("slot_range", f"slot {i} of {self._h.nslots}", self.path)

    @staticmethod
    def _clamp(sup_bw: int) -> int:
        """A sup_bw from user code: any integer (int, numpy's; not bool) >= 0."""
        n = integer(sup_bw)
        if n is None or n < 0:
            raise SegmentError("bad_value", f"sup_bw {sup_bw!r}: want an integer 0..1024")
        v, clamped = clamp(n)
        if clamped:
            warnings.warn(HintClampedWarning(n, v), stacklevel=3)
        return v

    def set_slot_hint(self, slot: int, sup_bw: Optional[int], *, gen: int) -> int:
        """Sets (or with None clears) the hint of ACTIVE slot ``slot`` for the registration
        ``gen`` the caller read (``Slot.gen``): when the slot now holds another registration
        the write is refused with :class:`GenerationChanged`, so a hint never lands on another
        connection. Returns the stored value; a value above 1024 is stored as 1024 with a
        HintClampedWarning."""
        n = integer(slot)
        if n is None:
            raise SegmentError("bad_value", f"slot {slot!r}: want an integer", self.path)
        slot = n
        off = slot_off(slot)
        with self._lock():
            self._check_slot(slot)
            v = 0 if sup_bw is None else self._clamp(sup_bw)
            self._check_size()
            if self._v.u64(off + S_OWNER) & 0xFFFFFFFF != STATE_ACTIVE:
                raise SegmentError("slot_inactive", f"slot {slot} is not active", self.path)
            cur = self._v.u32(off + S_GEN)
            if cur != gen:
                raise GenerationChanged(slot, gen, cur, self.path)
            rec = Record(sup_bw=v, flags=0 if sup_bw is None else FLAG_VALID, gen=gen, set_ns=now_ns())
            self._v.write_record(off + S_HINT, rec)
        return v

    def set_class_hint(self, path_class: Union[str, int], sup_bw: Optional[int]) -> int:
        """Sets (or clears) the default of a path class: "intra"/0 or "inter"/1."""
        c = parse_class(path_class)
        v = 0 if sup_bw is None else self._clamp(sup_bw)
        with self._lock():
            self._check_size()
            rec = Record(sup_bw=v, flags=0 if sup_bw is None else FLAG_VALID, set_ns=now_ns())
            self._v.write_record(class_off(c), rec)
        return v

    def set_peer_hint(self, peer: str, sup_bw: Optional[int], prefix_len: Optional[int] = None) -> int:
        """Sets (or clears) the default for a peer: "10.0.2.7", "10.0.2.0/24". The key is the
        address masked to the prefix (spec 5.6): "10.0.2.7/24" and "10.0.2.0/24" name one
        entry, whichever spelling wrote it."""
        ip_s, _, plen_s = peer.partition("/")
        try:
            plen = prefix_len if prefix_len is not None else int(plen_s) if plen_s else 32
            ip = ip_int(ip_s)
        except ValueError as e:
            raise SegmentError("bad_value", f"peer {peer!r}: {e}") from None
        if not 0 <= plen <= 32:
            raise SegmentError("bad_prefix", f"prefix length {plen} not in 0..32")
        mask = prefix_mask(plen)
        ip &= mask
        v = 0 if sup_bw is None else self._clamp(sup_bw)
        with self._lock():
            self._check_size()
            target, free, repaired = None, None, False
            base = peer_off(self._h.nslots, 0)
            img = View(self._v.read(base, self._h.npeers * PEER_SIZE))
            for j in range(self._h.npeers):
                r, ok = img.read_record(j * PEER_SIZE)
                if not ok:
                    # A dead writer's entry (spec 5.1): skipping it could write its key a
                    # second time. Repaired, it is free.
                    repaired = self._repair(base + j * PEER_SIZE) or repaired
                    r = Record()
                if not r.valid and free is None:
                    free = j
                elif r.valid and r.prefix_len == plen and ip_int(r.peer_ip) & mask == ip:
                    target = j
                    break
            if target is None:
                if sup_bw is None:
                    if repaired:
                        self._bump_peers_epoch()
                    return 0
                if free is None:
                    raise SegmentError("peer_table_full", f"all {self._h.npeers} peer entries in use", self.path)
                target = free
            rec = Record(
                sup_bw=v,
                flags=0 if sup_bw is None else FLAG_VALID,
                set_ns=now_ns(),
                peer_ip=ip_str(ip),
                prefix_len=plen,
            )
            self._v.write_record(peer_off(self._h.nslots, target), rec)
            self._bump_peers_epoch()
        return v

    # -- slots of dead processes ------------------------------------------------------------

    def lease_held(self, i: int) -> bool:
        """Whether a live process holds slot i's lease (spec 5.7)."""
        with self._io:
            self._check_slot(i)
            return _lock_held(self._fd, slot_lock_off(i))

    def gc(self) -> List[int]:
        """Reclaims slots whose owner is gone (spec 5.7): an owner word that is not zero while
        no process holds the slot's lease (an OFD lock the kernel drops when its holder dies,
        whatever PID namespace it lives in). Returns their indices.

        Each lease check walks the kernel's list of the file's locks, so a pass over n held
        slots costs ~n^2 (a minute for 65536): it takes the writer lock for _GC_CHUNK slots at
        a time, so that other writers (a policy tick, a ``set``) wait for one chunk, not for
        the pass. A pass that finds the segment replaced between chunks stops there."""
        freed: List[int] = []
        with self._lock():
            self._check_size()
            at, n = self._attachment, self._h.nslots
            self._repair_defaults()
        for lo in range(0, n, _GC_CHUNK):
            with self._lock():
                if self._attachment != at:
                    break
                self._check_size()
                freed += self._gc_slots(lo, min(lo + _GC_CHUNK, n))
        return freed

    def _gc_slots(self, lo: int, hi: int) -> List[int]:
        """Repairs the odd hints of slots lo..hi-1 and reclaims the dead owners' slots among
        them (the caller holds the writer lock)."""
        img = View(self._v.read(slot_off(lo), slot_off(hi) - slot_off(lo)))
        for i in range(lo, hi):
            if img.u32((i - lo) * SLOT_SIZE + S_HINT + R_SEQ) & 1:
                self._repair(slot_off(i) + S_HINT)
        return [i for i in range(lo, hi) if img.u64((i - lo) * SLOT_SIZE + S_OWNER) and self._reclaim(i)]

    def _repair(self, off: int) -> bool:
        """Clears the hint record at off when its seq is odd; returns whether it did. The
        caller holds the writer lock (spec 5.5), so no live writer is mid-write there: an odd
        seq was left by a writer that died (or was interrupted) between its two seq stores
        (spec 5.1). Its fields may be a torn mix of two records, so it is never made even as it
        stands: write_record reuses the odd seq, stores zero into every field (no VALID: no
        hint), then the even seq."""
        if not self._v.u32(off + R_SEQ) & 1:
            return False
        self._v.write_record(off, Record())
        return True

    def _repair_defaults(self) -> None:
        """Repairs the class defaults and the peer entries (spec 5.1), bumping peers_epoch when
        it repaired a peer entry so that readers that cached a scan look again; the caller
        holds the writer lock."""
        self._repair(class_off(0))
        self._repair(class_off(1))
        img = View(self._v.read(peer_off(self._h.nslots, 0), self._h.npeers * PEER_SIZE))
        peers = [j for j in range(self._h.npeers) if img.u32(j * PEER_SIZE + R_SEQ) & 1]
        for j in peers:
            self._repair(peer_off(self._h.nslots, j))
        if peers:
            self._bump_peers_epoch()

    def _bump_peers_epoch(self) -> None:
        self._v.put32(OFF_PEERS_EPOCH, self._v.u32(OFF_PEERS_EPOCH) + 1)

    def _reclaim(self, i: int) -> bool:
        """Frees slot i if its owner is dead (the caller holds the writer lock). It takes the
        slot's lease itself, never waiting: a lease it cannot take belongs to a live owner.
        While it holds the lease no plugin can claim or release the slot (both happen under
        the lease), so a non-zero owner word read then is a dead owner's, and storing 0 needs
        no compare-and-swap. Checking the lease without taking it would race: the owner word
        is not unique per registration (the same pid claims again), so a release and a new
        claim between the check and the store would free a live slot. This Segment's open
        file description never holds a slot lease, so taking one through it is sound."""
        lease = slot_lock_off(i)
        if not _lock_byte(self._fd, lease, fcntl.F_WRLCK):
            return False
        try:
            off = slot_off(i) + S_OWNER
            if self._v.u64(off) == 0:
                return False
            self._v.put64(off, 0)
            return True
        finally:
            _lock_byte(self._fd, lease, fcntl.F_UNLCK)

    # -- a replaced or truncated segment ----------------------------------------------------

    def replaced(self) -> bool:
        """Whether the path names another file than the open one, or it was truncated."""
        with self._io:
            if self._v.gone:
                return True
            try:
                st = os.lstat(self.path)
            except OSError:
                return False
            return (st.st_dev, st.st_ino) != (self._dev, self._ino) or os.fstat(self._fd).st_size < self._h.total_size

    def reattach(self) -> bool:
        """Moves to the segment now at the path when the file was replaced or truncated. An
        agent lock held on the old file is taken on the new one first (SegmentError
        agent_running when another agent holds it: nothing moves). Returns whether it moved
        (``attachment`` then changed)."""
        if not self.replaced():
            return False
        n = open_segment(self.path)
        with self._io:
            try:
                if self._agent:
                    n.acquire_agent()
            except BaseException:
                n.close()
                raise
            with self._swap:
                old = self._fd
                self._fd, self._h, self._v = n._fd, n._h, n._v
                self._dev, self._ino = n._dev, n._ino
                self._last_beat = 0
                self._attachment += 1
                n._fd = -1
                os.close(old)
        return True


def open_segment(path: Optional[str] = None) -> Segment:
    """Opens and validates (spec section 6) the segment; raises SegmentError or OSError. A
    symbolic link is refused (O_NOFOLLOW); the open never waits (``_open_nonblocking``)."""
    p = path or default_path()
    fd = _open_nonblocking(p)
    try:
        st = os.fstat(fd)
        _check_stat(st, p)  # again: the path may name another file than the one checked
        head = os.pread(fd, HEADER_SIZE, 0)
        h = validate_header(head, st.st_size, p)
    except BaseException:
        os.close(fd)
        raise
    return Segment(p, fd, h, st)


def create(path: Optional[str] = None, nslots: int = 1024, npeers: int = 256, *, force: bool = False) -> Segment:
    """Creates a zeroed segment with mode 0600 and opens it (spec 5.8). Refuses
    (SegmentError("segment_live")) to replace a segment in use (an agent beats it, or a plugin
    or agent holds it open) unless ``force``: plugins then move to the new segment within
    their poll period. A file at path owned by another user is always refused (bad_owner)."""
    p = path or default_path()
    _new_file(p, nslots, npeers, force)
    return open_segment(p)


__all__ = [
    "Segment",
    "Liveness",
    "create",
    "open_segment",
    "liveness",
    "now_ns",
    "default_path",
    "stale_ns_from_env",
    "beat_period_s",
]
