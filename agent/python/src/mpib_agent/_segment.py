"""A live read-write mapping of the segment (spec sections 5 and 6)."""

from __future__ import annotations

import fcntl
import mmap
import os
import stat
import tempfile
import time
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Union

from ._format import (
    DEFAULT_PATH,
    FLAG_VALID,
    HEADER_SIZE,
    MAGIC,
    MAX_PEERS,
    MAX_SLOTS,
    OFF_AGENT_PID,
    OFF_CREATED,
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
    S_GEN,
    S_HINT,
    S_OWNER,
    SLOT_SIZE,
    STATE_ACTIVE,
    VERSION,
    Header,
    HintClampedWarning,
    Record,
    Resolution,
    SegmentError,
    Slot,
    Snapshot,
    View,
    class_off,
    clamp,
    decode_header,
    decode_slot,
    decode_view,
    ip_int,
    ip_str,
    peer_off,
    resolve_view,
    slot_off,
    total_size,
    validate_header,
)


def now_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds: the segment's time base."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def default_path() -> str:
    return os.environ.get("MPIB_SHM_PATH") or DEFAULT_PATH


def stale_ns_from_env() -> int:
    try:
        ms = int(os.environ.get("MPIB_AGENT_STALE_MS", ""))
    except ValueError:
        ms = 0
    return (ms if ms > 0 else 500) * 1_000_000


_CLASSES = {"intra": 0, "inter": 1, "0": 0, "1": 1}


def parse_class(c: Union[str, int]) -> int:
    v = _CLASSES.get(str(c).lower())
    if v is None:
        raise SegmentError("bad_class", f"path class must be intra (0) or inter (1), got {c!r}")
    return v


class Segment:
    """A mapped hint segment. Use :func:`open_segment` or :func:`create`; close it (or use it
    as a context manager) when done."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, header: Header) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        self._h = header
        self._v = View(mm, live=True)

    def __enter__(self) -> "Segment":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd < 0:
            return
        self._v.release()
        self._mm.close()
        os.close(self._fd)
        self._fd = -1

    @property
    def nslots(self) -> int:
        return self._h.nslots

    @property
    def npeers(self) -> int:
        return self._h.npeers

    def header(self) -> Header:
        """The header with the live heartbeat and epoch."""
        return decode_header(self._v)

    @contextmanager
    def _lock(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    # -- heartbeat -------------------------------------------------------------------------

    def beat(self, now: Optional[int] = None) -> None:
        """Stores the heartbeat; hints apply only while it is fresh."""
        self._v.put32(OFF_AGENT_PID, os.getpid())
        self._v.put64(OFF_HEARTBEAT, now_ns() if now is None else now)

    def stop_beat(self) -> None:
        """Clean exit: plugins fall back to vanilla at once."""
        self._v.put64(OFF_HEARTBEAT, 0)

    def agent_alive(self, stale_ns: Optional[int] = None) -> bool:
        from ._format import heartbeat_fresh

        st = stale_ns_from_env() if stale_ns is None else stale_ns
        return heartbeat_fresh(self._v.u64(OFF_HEARTBEAT), now_ns(), st)

    # -- reading ---------------------------------------------------------------------------

    def connections(self) -> List[Slot]:
        """Active slots, hints read under their seqlock."""
        out = []
        for i in range(self._h.nslots):
            off = slot_off(i)
            if self._v.u64(off + S_OWNER) & 0xFFFFFFFF == STATE_ACTIVE:
                rec, _ = self._v.read_record(off + S_HINT)
                out.append(decode_slot(self._v, i, rec))
        return out

    def slot(self, i: int) -> Slot:
        self._check_slot(i)
        rec, _ = self._v.read_record(slot_off(i) + S_HINT)
        return decode_slot(self._v, i, rec)

    def snapshot(self) -> Snapshot:
        return decode_view(self._v, self.header())

    def resolve(self, slot: int, now: Optional[int] = None, stale_ns: Optional[int] = None) -> Resolution:
        """What the plugin would decide for ``slot`` now (spec 5.3)."""
        return resolve_view(
            self._v,
            self._h,
            slot,
            now_ns() if now is None else now,
            stale_ns_from_env() if stale_ns is None else stale_ns,
        )

    # -- writing hints ---------------------------------------------------------------------

    def _check_slot(self, i: int) -> None:
        if not 0 <= i < self._h.nslots:
            raise SegmentError("slot_range", f"slot {i} of {self._h.nslots}", self.path)

    @staticmethod
    def _clamp(sup_bw: int) -> int:
        if sup_bw < 0:
            raise SegmentError("bad_value", f"sup_bw {sup_bw} is negative")
        v, clamped = clamp(sup_bw)
        if clamped:
            warnings.warn(HintClampedWarning(sup_bw, v), stacklevel=3)
        return v

    def set_slot_hint(self, slot: int, sup_bw: Optional[int]) -> int:
        """Sets (or with None clears) an ACTIVE slot's hint. Returns the stored value; a
        value above 1024 is stored as 1024 with a HintClampedWarning."""
        self._check_slot(slot)
        v = 0 if sup_bw is None else self._clamp(sup_bw)
        off = slot_off(slot)
        with self._lock():
            if self._v.u64(off + S_OWNER) & 0xFFFFFFFF != STATE_ACTIVE:
                raise SegmentError("slot_inactive", f"slot {slot} is not active", self.path)
            gen = self._v.u32(off + S_GEN)
            rec = Record(sup_bw=v, flags=0 if sup_bw is None else FLAG_VALID, gen=gen, set_ns=now_ns())
            self._v.write_record(off + S_HINT, rec)
        return v

    def set_class_hint(self, path_class: Union[str, int], sup_bw: Optional[int]) -> int:
        """Sets (or clears) the default of a path class: "intra"/0 or "inter"/1."""
        c = parse_class(path_class)
        v = 0 if sup_bw is None else self._clamp(sup_bw)
        with self._lock():
            rec = Record(sup_bw=v, flags=0 if sup_bw is None else FLAG_VALID, set_ns=now_ns())
            self._v.write_record(class_off(c), rec)
        return v

    def set_peer_hint(self, peer: str, sup_bw: Optional[int], prefix_len: Optional[int] = None) -> int:
        """Sets (or clears) the default for a peer: "10.0.2.7", "10.0.2.0/24"."""
        ip_s, _, plen_s = peer.partition("/")
        plen = prefix_len if prefix_len is not None else int(plen_s) if plen_s else 32
        if not 0 <= plen <= 32:
            raise SegmentError("bad_prefix", f"prefix length {plen} not in 0..32")
        ip = ip_int(ip_s)
        v = 0 if sup_bw is None else self._clamp(sup_bw)
        with self._lock():
            target, free = None, None
            for j in range(self._h.npeers):
                r, ok = self._v.read_record(peer_off(self._h.nslots, j))
                if not ok:
                    continue
                if not r.valid and free is None:
                    free = j
                elif r.valid and ip_int(r.peer_ip) == ip and r.prefix_len == plen:
                    target = j
                    break
            if target is None:
                if sup_bw is None:
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
            self._v.put32(OFF_PEERS_EPOCH, self._v.u32(OFF_PEERS_EPOCH) + 1)
        return v

    def gc(self, alive: Optional[Callable[[int], bool]] = None) -> List[int]:
        """Reclaims slots whose owner process is gone (spec 5.7); returns their indices."""
        is_alive = alive or _pid_alive
        freed = []
        with self._lock():
            for i in range(self._h.nslots):
                off = slot_off(i)
                owner = self._v.u64(off + S_OWNER)
                if owner and not is_alive(owner >> 32) and self._v.u64(off + S_OWNER) == owner:
                    self._v.put64(off + S_OWNER, 0)
                    freed.append(i)
        return freed


def _pid_alive(pid: int) -> bool:
    if pid == 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def open_segment(path: Optional[str] = None) -> Segment:
    """Opens and validates (spec section 6) the segment; raises SegmentError or OSError."""
    p = path or default_path()
    fd = os.open(p, os.O_RDWR | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SegmentError("not_regular", "not a regular file", p)
        if st.st_uid != os.geteuid():
            raise SegmentError("bad_owner", f"owned by uid {st.st_uid}, this process runs as {os.geteuid()}", p)
        if st.st_mode & 0o022:
            raise SegmentError("bad_mode", f"mode {st.st_mode & 0o7777:04o} is group/world writable (want 0600)", p)
        head = os.pread(fd, HEADER_SIZE, 0)
        h = validate_header(head, st.st_size, p)
        mm = mmap.mmap(fd, h.total_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return Segment(p, fd, mm, h)


def create(path: Optional[str] = None, nslots: int = 1024, npeers: int = 256) -> Segment:
    """Creates a zeroed segment with mode 0600 (replacing any file there) and opens it."""
    p = path or default_path()
    if not 1 <= nslots <= MAX_SLOTS or not 0 <= npeers <= MAX_PEERS:
        raise SegmentError("bad_geometry", f"nslots={nslots} (1..{MAX_SLOTS}) npeers={npeers} (0..{MAX_PEERS})", p)
    size = total_size(nslots, npeers)
    head = bytearray(HEADER_SIZE)
    v = View(head)
    head[:8] = MAGIC
    v.put32(OFF_VERSION, VERSION)
    v.put32(OFF_HEADER_SIZE, HEADER_SIZE)
    v.put64(OFF_TOTAL, size)
    v.put32(OFF_NSLOTS, nslots)
    v.put32(OFF_SLOT_SIZE, SLOT_SIZE)
    v.put32(OFF_NPEERS, npeers)
    v.put32(OFF_PEER_SIZE, PEER_SIZE)
    v.put64(OFF_CREATED, now_ns())
    v.release()
    d = os.path.dirname(os.path.abspath(p))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(p) + ".tmp", dir=d)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        os.pwrite(fd, bytes(head), 0)
        os.rename(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return open_segment(p)


__all__ = ["Segment", "create", "open_segment", "now_ns", "default_path", "stale_ns_from_env"]
