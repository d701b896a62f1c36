"""The segment file under an open ``Segment`` (spec section 5): the clock and the settings
read from the environment, the OFD locks, the ``FileView`` every field access goes through, a
file's liveness, the checks before an open, and the writing of a new segment file. Nothing here
holds a segment open: ``_segment`` does.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import struct
import tempfile
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from ._codec import View, decode_header, record_fields, record_from
from ._layout import (
    DEFAULT_PATH_PREFIX,
    DEFAULT_STALE_MS,
    HEADER_SIZE,
    MAGIC,
    MAX_PEERS,
    MAX_SLOTS,
    MAX_STALE_MS,
    OFF_CREATED,
    OFF_HEADER_SIZE,
    OFF_NPEERS,
    OFF_NSLOTS,
    OFF_PEER_SIZE,
    OFF_SLOT_SIZE,
    OFF_TOTAL,
    OFF_VERSION,
    PEER_SIZE,
    R_SEQ,
    R_SUP_BW,
    REC_FIELDS_FMT,
    REC_FMT,
    SEQ_ATTEMPTS,
    SLOT_SIZE,
    VERSION,
    slot_off,
    total_size,
)
from ._resolve import heartbeat_fresh
from ._types import Record, SegmentError


def now_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds: the segment's time base."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# White space as the plugin trims its settings with (Go's strings.TrimSpace: unicode.IsSpace).
# Python's str.strip() would also trim U+001C..U+001F.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_GO_ATOI = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.Atoi accepts


def _setting(name: str) -> str:
    """An MPIB_* variable as the plugin reads its settings: leading and trailing white space
    removed (as Go's strings.TrimSpace does)."""
    return os.environ.get(name, "").strip(_GO_SPACE)


def default_path() -> str:
    """$MPIB_SHM_PATH (white space trimmed, as the plugin reads it), else
    /dev/shm/mpib-hints-EUID (the plugin's default too)."""
    return _setting("MPIB_SHM_PATH") or f"{DEFAULT_PATH_PREFIX}{os.geteuid()}"


def stale_ns_from_env() -> int:
    """MPIB_AGENT_STALE_MS in ns, read as the plugin reads it: white space trimmed, then a signed
    decimal integer (Go's strconv.Atoi: " 100 " and "+100" are 100) in 1..3600000. Unset,
    anything else or out of range: the default, 500 ms (the plugin refuses such a value)."""
    v = _setting("MPIB_AGENT_STALE_MS")
    ms = int(v) if _GO_ATOI.fullmatch(v) and 1 <= int(v) <= MAX_STALE_MS else DEFAULT_STALE_MS
    return ms * 1_000_000


def beat_period_s(stale_ns: Optional[int] = None) -> float:
    """How often an agent beats: stale/4 (spec 5.2), at least 1 ms."""
    st = stale_ns_from_env() if stale_ns is None else stale_ns
    return max(st // 4, 1_000_000) / 1e9


# ---- OFD locks (spec 5.7) ---------------------------------------------------------------

_FLOCK = struct.Struct("@hhqqi4x")  # struct flock on Linux x86-64 and aarch64 (32 bytes)


def _lock_byte(fd: int, off: int, typ: int) -> bool:
    """Takes (F_RDLCK/F_WRLCK, never waiting) or drops (F_UNLCK) an OFD lock on one byte;
    False when another open file description holds a conflicting one."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(typ, os.SEEK_SET, off, 1, 0))
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _lock_held(fd: int, off: int, length: int = 1) -> bool:
    """Whether another open file description holds a lock on [off, off+length) (0: to EOF)."""
    t = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, off, length, 0)))
    return bool(t[0] != fcntl.F_UNLCK)


def slot_lock_off(i: int) -> int:
    """The lock byte of slot i's lease: the slot's first byte."""
    return slot_off(i)


# ---- the file view ----------------------------------------------------------------------


class FileView:
    """Fields of the segment file through pread/pwrite (see the module's docstring)."""

    def __init__(self, fd: int, path: str, size: int) -> None:
        self.fd = fd
        self.path = path
        self.size = size  # the segment's total size from its header
        self.gone = False

    def _gone(self) -> SegmentError:
        self.gone = True
        return SegmentError(
            "segment_gone",
            "the segment was truncated under this process (re-create it; reattach() follows a new one)",
            self.path,
        )

    def read(self, off: int, n: int) -> bytes:
        if self.gone:
            raise self._gone()
        b = os.pread(self.fd, n, off)
        if len(b) != n:
            raise self._gone()
        return b

    def write(self, off: int, b: bytes) -> None:
        if self.gone:
            raise self._gone()
        os.pwrite(self.fd, b, off)
        # A pwrite past the end of a file that was truncated meanwhile extends it again
        # (zeros up to this field): undo that, so that a truncated segment stays empty and
        # every reader keeps seeing it gone. The descriptor names this inode only (create()
        # replaces a segment by renaming a new file over the path), so this never touches a
        # new segment.
        if os.fstat(self.fd).st_size < self.size:
            os.ftruncate(self.fd, 0)
            raise self._gone()

    def region(self, off: int, n: int) -> Tuple[View, int]:
        return View(self.read(off, n)), 0

    def u8(self, off: int) -> int:
        return self.read(off, 1)[0]

    def u16(self, off: int) -> int:
        v: int = struct.unpack("<H", self.read(off, 2))[0]
        return v

    def u32(self, off: int) -> int:
        v: int = struct.unpack("<I", self.read(off, 4))[0]
        return v

    def u64(self, off: int) -> int:
        v: int = struct.unpack("<Q", self.read(off, 8))[0]
        return v

    def put8(self, off: int, v: int) -> None:
        self.write(off, struct.pack("<B", v & 0xFF))

    def put16(self, off: int, v: int) -> None:
        self.write(off, struct.pack("<H", v & 0xFFFF))

    def put32(self, off: int, v: int) -> None:
        self.write(off, struct.pack("<I", v & 0xFFFFFFFF))

    def put64(self, off: int, v: int) -> None:
        self.write(off, struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF))

    def raw_record(self, off: int) -> Record:
        return record_from(struct.unpack(REC_FMT, self.read(off, struct.calcsize(REC_FMT))))

    def read_record(self, off: int) -> Tuple[Record, bool]:
        """Seqlock read (spec 5.1): (record, consistent)."""
        n = struct.calcsize(REC_FIELDS_FMT)
        for _ in range(SEQ_ATTEMPTS):
            s1 = self.u32(off + R_SEQ)
            if s1 & 1:
                continue
            fields = struct.unpack(REC_FIELDS_FMT, self.read(off + R_SUP_BW, n))
            if self.u32(off + R_SEQ) == s1:
                return record_from((s1,) + fields), True
        return self.raw_record(off), False

    def write_fields(self, off: int, r: Record) -> None:
        self.write(off + R_SUP_BW, struct.pack(REC_FIELDS_FMT, *record_fields(r)))

    def write_record(self, off: int, r: Record) -> None:
        """Seqlock write (spec 5.1); the caller holds the writer lock."""
        w = self.u32(off + R_SEQ) | 1
        self.put32(off + R_SEQ, w)
        self.write_fields(off, r)
        self.put32(off + R_SEQ, w + 1)


# ---- liveness -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Liveness:
    """Whether a segment file is in use (spec 5.8)."""

    heartbeat_fresh: bool = False
    agent_pid: int = 0
    locked: bool = False  # a plugin has it attached, an agent holds the agent lock, or a slot is leased

    @property
    def live(self) -> bool:
        return self.heartbeat_fresh or self.locked

    def __str__(self) -> str:
        if self.locked and self.heartbeat_fresh:
            return f"an agent (pid {self.agent_pid}) beats it and processes hold it open"
        if self.heartbeat_fresh:
            return f"an agent (pid {self.agent_pid}) beats it"
        if self.locked:
            return "plugin or agent processes hold it open"
        return "unused"


def liveness(path: str) -> Liveness:
    """Inspects the file at path without using it: a missing file or one that is not a
    segment is not live."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return Liveness()
    except OSError as e:
        if e.errno == errno.ELOOP:
            return Liveness()
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Liveness()
        fresh, pid = False, 0
        head = os.pread(fd, HEADER_SIZE, 0)
        if len(head) == HEADER_SIZE and head[:8] == MAGIC:
            h = decode_header(View(head))
            if h.version == VERSION:
                fresh, pid = heartbeat_fresh(h.heartbeat_ns, now_ns(), stale_ns_from_env()), h.agent_pid
        return Liveness(fresh, pid, _lock_held(fd, 0, 0))
    finally:
        os.close(fd)


def _check_stat(st: os.stat_result, p: str) -> None:
    """Checks 2..4 of the spec's validation table on a file's status."""
    if stat.S_ISLNK(st.st_mode):
        raise SegmentError("not_regular", "a symbolic link (refused: O_NOFOLLOW)", p)
    if not stat.S_ISREG(st.st_mode):
        raise SegmentError("not_regular", "not a regular file", p)
    if st.st_uid != os.geteuid():
        raise SegmentError("bad_owner", f"owned by uid {st.st_uid}, this process runs as {os.geteuid()}", p)
    if st.st_mode & 0o077:  # readable by others shows peers and rates; writable lets them steer
        raise SegmentError(
            "bad_mode", f"mode {st.st_mode & 0o7777:04o} grants group/other access (want 0600: chmod 600)", p
        )


def _open_nonblocking(p: str) -> int:
    """Opens the segment file read-write without ever waiting: it is checked (type, owner,
    mode) before it is opened at all, and opened with O_NONBLOCK, so a file another process
    holds a lease on fails at once instead of waiting for the lease break (45 s by default)."""
    _check_stat(os.lstat(p), p)
    try:
        return os.open(p, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SegmentError("not_regular", "a symbolic link (refused: O_NOFOLLOW)", p) from None
        if e.errno == errno.EWOULDBLOCK:
            raise OSError(
                e.errno, f"another process holds a lease on the file (EWOULDBLOCK): try again later: {p}"
            ) from None
        raise


def _reserve(fd: int, p: str, size: int) -> None:
    """Sizes a new segment file to ``size`` zero bytes with every page allocated, so that a full
    file system (a container's /dev/shm is 64 MiB by default) fails the create at once, not the
    first touch of a page later: that is a SIGBUS in every process mapping the file. (glibc's
    posix_fallocate writes the zeros on a file system without fallocate.)"""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise OSError(
                e.errno,
                f"create {p}: cannot reserve the segment's {size} bytes: {os.strerror(e.errno)} (the file system "
                "is full: free space, give a container a larger /dev/shm (docker run --shm-size), "
                "or create fewer --slots/--peers)",
            ) from None
        raise


def _new_file(p: str, nslots: int, npeers: int, force: bool) -> None:
    """Makes the file ``create`` opens: refuses a bad geometry, another user's file and (unless
    ``force``) a live segment, then writes a zeroed segment with mode 0600 to a temporary file
    that it renames over p."""
    if not 1 <= nslots <= MAX_SLOTS or not 0 <= npeers <= MAX_PEERS:
        raise SegmentError("bad_geometry", f"nslots={nslots} (1..{MAX_SLOTS}) npeers={npeers} (0..{MAX_PEERS})", p)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    if st is not None:
        if st.st_uid != os.geteuid():
            raise SegmentError(
                "bad_owner",
                f"exists and belongs to uid {st.st_uid} (this process runs as "
                f"{os.geteuid()}): remove it or choose another MPIB_SHM_PATH",
                p,
            )
        if not force:
            lv = liveness(p)
            if lv.live:
                raise SegmentError(
                    "segment_live", f"{lv} (use --force to replace it; plugins move to the new segment)", p
                )
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
        _reserve(fd, p, size)
        os.pwrite(fd, bytes(head), 0)
        os.rename(tmp, p)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
