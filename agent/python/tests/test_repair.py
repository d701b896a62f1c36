"""A hint writer that dies between its two seq stores leaves the record odd: every reader finds
it busy, for every registration of the slot, until an agent repairs it (spec 5.1). gc() clears
every odd record (class, slot hint, peer entry); a peer write clears the odd entries its scan
meets and never writes a second entry with the same key. The C test agent's rule
(plugin/ctest/shm_odd_repair_test.c); Go: TestOddRecordRepaired."""

from __future__ import annotations

from typing import Any

import mpib_agent
from conftest import fake_register
from mpib_agent._layout import OFF_PEERS_EPOCH, R_SEQ, R_SUP_BW, S_GEN, S_HINT, class_off, peer_off, slot_off
from mpib_agent._segfile import FileView

CLASS_300 = mpib_agent.Resolution(True, 300, "class", False)


def _resolve(seg: mpib_agent.Segment) -> Any:
    seg.beat()
    return seg.resolve(0)


def _epoch(seg: mpib_agent.Segment) -> int:
    return seg._v.u32(OFF_PEERS_EPOCH)


def test_gc_repairs_odd_slot_and_class_records(seg: mpib_agent.Segment) -> None:
    seg.set_class_hint(0, 300)
    fake_register(seg, 0, "10.0.2.7", 0)
    assert _resolve(seg) == CLASS_300
    hint = slot_off(0) + S_HINT
    seg._v.put32(hint + R_SEQ, 1)  # a writer of the slot's hint dies after its first seq store
    seg._v.put32(hint + R_SUP_BW, 900)
    assert _resolve(seg).source == "busy"
    seg._v.put32(slot_off(0) + S_GEN, 2)  # a later registration: the claim leaves the hint
    assert _resolve(seg).source == "busy"
    assert seg.gc() == []
    r = seg._v.raw_record(hint)
    assert (r.seq, r.flags, r.sup_bw) == (2, 0, 0), f"slot hint after gc: {r}"
    assert _resolve(seg) == CLASS_300

    seg._v.put32(class_off(0) + R_SEQ, 3)
    assert _resolve(seg).source == "busy"
    seg.gc()
    assert _resolve(seg).source == "no_hint"  # cleared: no VALID


def test_peer_write_and_gc_repair_odd_peer_entries(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 0, "10.0.2.7", 0)
    seg.set_peer_hint("10.0.2.7", 700)
    assert _resolve(seg) == mpib_agent.Resolution(True, 700, "peer", False)
    e0 = peer_off(seg.nslots, 0)
    seg._v.put32(e0 + R_SEQ, 5)  # its writer died mid-write: torn, never published as it stands
    seg._v.put32(e0 + R_SUP_BW, 9999)
    epoch = _epoch(seg)
    seg.set_peer_hint("10.0.2.7", 800)
    assert _epoch(seg) != epoch
    keyed = [p for p in seg.snapshot().peers if p.record.peer_ip == "10.0.2.7" and p.record.valid]
    assert len(keyed) == 1, f"entries with the key: {keyed}"
    assert _resolve(seg) == mpib_agent.Resolution(True, 800, "peer", False)

    seg._v.put32(e0 + R_SEQ, 7)  # a clear of a key that is not there meets it
    epoch = _epoch(seg)
    seg.set_peer_hint("10.9.9.9", None)
    assert _epoch(seg) != epoch and not seg._v.u32(e0 + R_SEQ) & 1

    seg._v.put32(e0 + R_SEQ, 9)
    epoch = _epoch(seg)
    seg.gc()
    assert _epoch(seg) != epoch and seg._v.raw_record(e0).seq == 10
    assert _resolve(seg).source == "no_hint"


def test_repair_of_a_record_interrupted_in_write_record(seg: mpib_agent.Segment, monkeypatch: Any) -> None:
    """Ctrl-C (KeyboardInterrupt) between write_record's two seq stores, as in a notebook."""
    seg.set_class_hint(0, 300)
    fake_register(seg, 0, "10.0.2.7", 0)

    def interrupted(self: FileView, off: int, r: Any) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(FileView, "write_fields", interrupted)
        try:
            seg.set_slot_hint(0, 900, gen=1)
        except KeyboardInterrupt:
            pass
    assert _resolve(seg).source == "busy"
    seg.gc()
    assert _resolve(seg) == CLASS_300
