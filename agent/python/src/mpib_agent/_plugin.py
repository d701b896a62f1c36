"""The plugin's side of the segment, in Python: FOR THE SIMULATOR AND TESTS ONLY.

The real plugin registers its connections (plugin/mpib_shm_conn.c), resolves hints and writes
telemetry (plugin/mpib_shm_hint.c) from C. :class:`PluginProcess` does the same through
``pread``/``pwrite`` so that a simulated plugin (``mpib_agent.sim``) or a test can stand in for
one on a real segment file:

- it holds the attach lock (spec 5.7: a shared OFD lock on byte 0) while it is open;
- :meth:`register` claims a slot as spec 5.4 says: the slot's lease (an exclusive OFD lock on
  the slot's first byte) first, then the owner word. Python has no compare-and-swap; the lease
  makes the claim safe: every claimer (plugin or simulator) takes the lease before writing a
  non-zero owner word, and agents reclaim a slot only while holding its lease themselves (5.7);
- :meth:`release` stores 0 into the owner word, then drops the lease;
- :meth:`record_read` and :meth:`put_counters` write the telemetry of spec 4.3 and 5.3, one
  ``pwrite`` per field (aligned stores of the field's size);
- :meth:`set_rail_state` records a rail's state change (failover, recovery).

Each PluginProcess is one simulated plugin process: it has an open file description of its
own, so its leases are its own (an agent in the same Python process, with another
:class:`~mpib_agent.Segment`, sees them held, as it would see a real plugin's).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from typing import Dict, Optional

from ._codec import put_device
from ._layout import (
    LOCK_ATTACH,
    RAIL_STATE_FIELDS,
    S_CLASS,
    S_CONN,
    S_GEN,
    S_ISLAND,
    S_LOCAL,
    S_OWNER,
    S_PEER,
    S_PID,
    S_QSOUT,
    S_QSUP,
    S_REG,
    S_SEND,
    S_SUP_PATH,
    S_TELEMETRY,
    S_TELEMETRY_END,
    SOURCES,
    STATE_ACTIVE,
    STATE_CLAIMING,
    TELEMETRY,
    slot_off,
)
from ._segfile import _lock_byte, slot_lock_off
from ._segment import Segment, now_ns, open_segment, stale_ns_from_env
from ._types import Resolution, SegmentError, ip_int

_TEL = {name: (o, size) for name, o, size in TELEMETRY}
_RAIL_OFF = dict(RAIL_STATE_FIELDS)
RAIL_NAMES = ("sout", "sup")


@dataclass(frozen=True)
class ConnDesc:
    """What the plugin stores in a slot's descriptor at registration (spec 4.3)."""

    conn_id: int
    peer_sout_ip: str = "10.0.2.7"
    local_sout_ip: str = "10.0.1.1"
    island_prefix_len: int = 24
    path_class: int = 1
    is_send: bool = True
    nqps_sout: int = 1
    nqps_sup: int = 1
    dev: int = 0  # the plugin's fused device (NCCL's device index)
    sout_port: int = 1  # the SOUT NIC's port (1-based)
    sup_port: int = 1
    sout_nic: str = ""  # the SOUT NIC's verbs device name ("mlx5_0"); cut to 23 bytes when stored
    sup_nic: str = ""
    sup_path: int = 0  # how SUP reaches the peer: 0 none, 1 direct, 2 routed, 3 island


class PluginProcess:
    """One (simulated) plugin process attached to the segment at ``path``: see the module's
    docstring. For the simulator and tests; the real plugin is C."""

    def __init__(self, path: str, pid: Optional[int] = None) -> None:
        self.pid = os.getpid() if pid is None else pid & 0xFFFFFFFF
        self.seg: Segment = open_segment(path)
        self._fd = self.seg._fd
        if not _lock_byte(self._fd, LOCK_ATTACH, fcntl.F_RDLCK):  # pragma: no cover (nobody write-locks byte 0)
            self.seg.close()
            raise SegmentError("io", "cannot take the attach lock", path)
        self.slots: Dict[int, int] = {}  # slot -> gen of the registrations this process holds

    @property
    def path(self) -> str:
        return self.seg.path

    def close(self) -> None:
        """Releases every registration, then closes the file (which drops every lock)."""
        for i in list(self.slots):
            try:
                self.release(i)
            except (SegmentError, OSError):
                pass
        self.seg.close()

    def __enter__(self) -> "PluginProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, d: ConnDesc) -> int:
        """Claims a free slot for connection ``d`` (spec 5.4) and returns its index; the new
        ``gen`` is in ``self.slots``. SegmentError("slots_full") when none is free."""
        v, n = self.seg._v, self.seg.nslots
        start = (self.pid * 31 + d.conn_id) % n
        with self.seg._io:
            self.seg._check_size()
            for k in range(n):
                i = (start + k) % n
                off = slot_off(i)
                if v.u64(off + S_OWNER) != 0 or not _lock_byte(self._fd, slot_lock_off(i), fcntl.F_WRLCK):
                    continue
                if v.u64(off + S_OWNER) != 0:  # claimed (or reclaimed) meanwhile: we hold the lease now,
                    _lock_byte(self._fd, slot_lock_off(i), fcntl.F_UNLCK)  # nobody else can claim it
                    continue
                v.put64(off + S_OWNER, STATE_CLAIMING | self.pid << 32)
                gen = (v.u32(off + S_GEN) + 1) & 0xFFFFFFFF or 1
                v.put32(off + S_GEN, gen)
                peer = ip_int(d.peer_sout_ip)
                mask = 0 if d.island_prefix_len == 0 else (0xFFFFFFFF << (32 - d.island_prefix_len)) & 0xFFFFFFFF
                v.put64(off + S_CONN, d.conn_id)
                v.put32(off + S_LOCAL, ip_int(d.local_sout_ip))
                v.put32(off + S_PEER, peer)
                v.put32(off + S_ISLAND, peer & mask)
                v.put8(off + S_CLASS, d.path_class)
                v.put8(off + S_SEND, 1 if d.is_send else 0)
                v.put16(off + S_QSOUT, d.nqps_sout)
                v.put16(off + S_QSUP, d.nqps_sup)
                v.put32(off + S_PID, self.pid)
                v.put64(off + S_REG, now_ns())
                put_device(v, off, d.dev, d.sout_port, d.sup_port, d.sout_nic, d.sup_nic)
                v.put8(off + S_SUP_PATH, d.sup_path)
                # telemetry restarts at 0 with each claim (not the NIC names after it)
                v.write(off + S_TELEMETRY, bytes(S_TELEMETRY_END - S_TELEMETRY))
                v.put64(off + S_OWNER, STATE_ACTIVE | self.pid << 32)
                self.slots[i] = gen
                return i
        raise SegmentError("slots_full", f"register: all {n} slots in use", self.path)

    def release(self, slot: int) -> None:
        """Frees a slot at close (spec 5.4): owner word to 0, then the lease."""
        if slot not in self.slots:
            raise SegmentError("slot_range", f"slot {slot} is not registered by this process", self.path)
        del self.slots[slot]
        with self.seg._io:
            try:
                if self.seg._fd >= 0 and self.seg.err() is None:
                    self.seg._check_size()
                    self.seg._v.put64(slot_off(slot) + S_OWNER, 0)
            finally:
                if self.seg._fd >= 0:
                    _lock_byte(self.seg._fd, slot_lock_off(slot), fcntl.F_UNLCK)

    def resolve(self, slot: int, now: Optional[int] = None, stale_ns: Optional[int] = None) -> Resolution:
        """The plugin's hint read (spec 5.3), with the reader in ``mpib_agent``."""
        return self.seg.resolve(slot, now, stale_ns_from_env() if stale_ns is None else stale_ns)

    def _put(self, slot: int, name: str, value: int) -> None:
        o, size = _TEL[name]
        off = slot_off(slot) + o
        (self.seg._v.put64 if size == 8 else self.seg._v.put32)(off, value)

    def _count(self, slot: int, name: str) -> None:
        """Adds one to a u32 telemetry counter (the caller holds the segment's lock)."""
        off = slot_off(slot) + _TEL[name][0]
        self.seg._v.put32(off, self.seg._v.u32(off) + 1)

    @staticmethod
    def record_read(res: Resolution, count: int, now: int, counters: Dict[str, int]) -> None:
        """Counts ``count`` hint reads that returned ``res`` (spec 5.3, end) in ``counters``
        (the process's copy of the slot's read counters) and writes them."""
        if res.applies:
            counters["reads_applied"] = counters.get("reads_applied", 0) + count
            counters["last_sup_bw"] = res.sup_bw
        else:
            counters["reads_fallback"] = counters.get("reads_fallback", 0) + count
            if res.source == "stale":
                counters["reads_stale"] = counters.get("reads_stale", 0) + count
        if res.clamped:
            counters["clamped"] = counters.get("clamped", 0) + count
        counters["last_source"] = SOURCES.index(res.source)
        counters["last_read_ns"] = now

    def put_counters(self, slot: int, counters: Dict[str, int]) -> None:
        """Writes telemetry fields (names of spec 4.3: sout_bytes, sup_requests, ...)."""
        with self.seg._io:
            self.seg._check_size()
            for name, value in counters.items():
                self._put(slot, name, value)

    def set_rail_state(self, slot: int, rail: str, state: int, realtime_ns: int) -> None:
        """Records a state change of ``rail`` ("sout" or "sup") to 0 up, 1 down, 2 failed at
        ``realtime_ns`` (CLOCK_REALTIME), as the plugin does: ``failovers`` counts a rail
        leaving service (up -> not up), ``recoveries`` its return (not up -> up)."""
        off = slot_off(slot)
        with self.seg._io:
            self.seg._check_size()
            v = self.seg._v
            so = off + _RAIL_OFF[f"{rail}_state"]
            was_up = v.u8(so) == 0
            if state != 0 and was_up:
                self._count(slot, "failovers")
            elif state == 0 and not was_up:
                self._count(slot, "recoveries")
            self._put(slot, f"{rail}_state_ns", realtime_ns)
            v.put8(so, state)


__all__ = ["ConnDesc", "PluginProcess", "RAIL_NAMES"]
