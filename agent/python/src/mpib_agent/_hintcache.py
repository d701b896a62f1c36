"""The simulator's hint read: spec 5.3 as the C plugin runs it, with the per-slot cache of the
matching peer entry that the spec allows (keyed by ``(peers_epoch, gen)``).

Without the cache every read with a fresh heartbeat and no slot hint scans the whole peer
table (256 entries by default, each a seqlock read in Python): a beating agent that writes no
slot hints made the simulator about 50 times slower than no agent at all. The C plugin
(plugin/mpib_shm_hint.c, shm_peer_lookup) caches the same way. It lives here, not in
``_plugin.PluginProcess.resolve`` (the uncached reader the tests compare with), so that the
simulator alone changes.

The hint records it reads on every tick (the slot's hint, a peer entry, a class default) are
also kept decoded per offset with their ``seq``: an unchanged even ``seq`` is an unchanged
record (spec 5.1: every write makes it odd, then even and larger), so one read of ``seq``
replaces the seqlock read and its decoding (a third of the simulator's time otherwise).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ._layout import OFF_PEERS_EPOCH, R_SEQ, peer_off
from ._resolve import _applied, _none, peer_scan, prefix_match, resolve_view
from ._segment import Segment
from ._types import Record, Resolution, ip_int


class CachedResolver:
    """Resolves hints on ``seg`` as :meth:`Segment.resolve` does (same sources, same order),
    remembering per slot which peer entry matched until ``peers_epoch`` or the slot's ``gen``
    changes; an entry that no longer matches is scanned for again, uncached, and a scan that
    skipped an entry caught mid-write is never cached (spec 5.3, 5)."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self._peer: Dict[int, Tuple[Tuple[int, int], Optional[int]]] = {}  # slot -> ((epoch, gen), entry)
        self._records: Dict[int, Record] = {}  # offset -> the record last read there, consistent

    def _record(self, v: Any, off: int) -> Tuple[Record, bool]:
        """The seqlock read of the record at ``off`` (record, consistent), from the copy read
        before when its seq has not moved."""
        seq = v.u32(off + R_SEQ)
        hit = self._records.get(off)
        if hit is not None and hit.seq == seq:
            return hit, True
        r, ok = v.read_record(off)
        if ok:
            self._records[off] = r
        return r, ok

    def resolve(self, slot: int, now: int, stale_ns: int) -> Resolution:
        """Spec 5.3 (``resolve_view``) with the cached record reads and peer lookup."""
        seg = self.seg
        with seg._io:
            v = seg._v
            return resolve_view(
                v, seg._h, slot, now, stale_ns, read=lambda off: self._record(v, off), peer=self._resolve_peer
            )

    def _resolve_peer(self, slot: int, gen: int, ip: int) -> Optional[Resolution]:
        """Step 5: the peer entry's hint, ``busy``, or None (no entry applies)."""
        v, h = self.seg._v, self.seg._h
        tag = (v.u32(OFF_PEERS_EPOCH), gen)
        for cached in (True, False):
            hit = self._peer.get(slot)
            if cached and hit is not None and hit[0] == tag:
                j = hit[1]
            else:
                j, complete = peer_scan(v, h, ip)
                if complete:
                    self._peer[slot] = (tag, j)
                else:  # it skipped an entry mid-write: the next read scans again (spec 5.3)
                    self._peer.pop(slot, None)
            if j is None:
                return None
            r, ok = self._record(v, peer_off(h.nslots, j))
            if not ok:
                return _none("busy")
            if r.valid and prefix_match(ip, ip_int(r.peer_ip), r.prefix_len):
                return _applied(r.sup_bw, "peer")
            # the entry changed without an epoch bump: scan once more, uncached
        return None
