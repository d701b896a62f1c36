"""A segment re-created at its path (``create --force``) while an agent writes it: the agent
follows it and writes its hints there again (the Go agent: agent/go/policy/replace_test.go)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import List, Tuple

import mpib_agent
from mpib_agent._plugin import ConnDesc, PluginProcess
from mpib_agent._policy import gone
from mpib_agent._types import SegmentError

CONN = ConnDesc(conn_id=7, peer_sout_ip="10.0.1.2", path_class=0)


def _bench(tmp_path: Path, nslots: int) -> Tuple[mpib_agent.Segment, List[PluginProcess]]:
    """A segment with the connection CONN (pid 4242) registered, and the plugins to close."""
    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=nslots, npeers=4)
    plugin = PluginProcess(seg.path, pid=4242)
    plugin.register(CONN)
    return seg, [plugin]


def _replace(seg: mpib_agent.Segment, plugins: List[PluginProcess], nslots: int, register: bool = True) -> int:
    """Re-creates the segment and moves seg to it; with register, the plugin registers CONN
    there again (gen 1, as in the old segment). Returns the connection's slot (-1: none)."""
    mpib_agent.create(seg.path, nslots=nslots, npeers=4, force=True).close()
    assert seg.reattach()
    if not register:
        return -1
    plugins.append(PluginProcess(seg.path, pid=4242))
    return plugins[-1].register(CONN)


def _hint(seg: mpib_agent.Segment, slot: int) -> Tuple[int, int, int]:
    """(sup_bw, hint gen, slot gen) of a valid hint; (-1, -1, -1) when none is in force."""
    s = seg.slot(slot)
    return (s.hint.sup_bw, s.hint.gen, s.gen) if s.hint.valid else (-1, -1, -1)


def test_attachment_counts_moves(tmp_path: Path) -> None:
    seg, plugins = _bench(tmp_path, 4)
    try:
        assert seg.attachment == 0 and not seg.reattach() and seg.attachment == 0
        _replace(seg, plugins, 4, register=False)
        assert seg.attachment == 1
    finally:
        seg.close()
        for p in plugins:
            p.close()


def test_static_after_segment_replaced(tmp_path: Path) -> None:
    """After segment_replaced() the next tick writes the class and peer defaults and the
    conns entry into the new segment, where the connection has the same slot and gen."""
    seg, plugins = _bench(tmp_path, 16)
    wf = tmp_path / "w.json"
    wf.write_text(json.dumps({"class": {"intra": 300}, "peers": {"10.0.1.0/24": 200}, "conns": {"4242:7": 700}}))
    try:
        p = mpib_agent.StaticWeights(str(wf))
        p.tick(seg, seg.connections())
        slot = seg.connections()[0].index
        assert _hint(seg, slot) == (700, 1, 1)
        assert _replace(seg, plugins, 16) == slot
        p.segment_replaced()
        p.tick(seg, seg.connections())
        assert _hint(seg, slot) == (700, 1, 1)
        snap = seg.snapshot()
        assert snap.class_defaults[0].valid and snap.class_defaults[0].sup_bw == 300
        assert [(e.record.valid, e.record.sup_bw) for e in snap.peers] == [(True, 200)]
    finally:
        seg.close()
        for pl in plugins:
            pl.close()


def test_slot_beyond_replaced_segment_is_gone(tmp_path: Path) -> None:
    """Connections read from a segment that a smaller one replaced before the write name slots
    beyond it: slot_range is gone(), and the static policy skips them instead of raising."""
    seg, plugins = _bench(tmp_path, 64)
    wf = tmp_path / "w.json"
    wf.write_text(json.dumps({"conns": {"4242:7": 700}}))
    try:
        conns = seg.connections()
        assert conns[0].index > 0, "the test needs the connection beyond slot 0"
        _replace(seg, plugins, 1, register=False)
        assert gone(SegmentError("slot_range", "x"))
        mpib_agent.StaticWeights(str(wf)).tick(seg, conns)
    finally:
        seg.close()
        for p in plugins:
            p.close()


def test_run_policy_after_segment_replaced(tmp_path: Path) -> None:
    """run_policy follows a replaced segment and tells a callback with segment_replaced()
    (ClosedLoopPolicy) before its next call: the connection, registered again with the slot
    and gen it had, gets its split in the new segment."""
    seg, plugins = _bench(tmp_path, 16)
    slot = seg.connections()[0].index
    agent = mpib_agent.open_segment(seg.path)  # the loop's Segment: it follows the replacement
    stop = threading.Event()
    t = threading.Thread(
        target=mpib_agent.run_policy,
        args=(agent, mpib_agent.ClosedLoopPolicy()),
        kwargs={"interval": 0.05, "stop": stop, "beat_every": 0.05},
    )
    t.start()
    try:
        end = time.monotonic() + 5
        while _hint(seg, slot) == (-1, -1, -1) and time.monotonic() < end:
            time.sleep(0.02)
        assert _hint(seg, slot) == (512, 1, 1)
        assert _replace(seg, plugins, 16) == slot
        while _hint(seg, slot) == (-1, -1, -1) and time.monotonic() < end:
            time.sleep(0.02)
        assert agent.attachment == 1
        assert _hint(seg, slot) == (512, 1, 1)
    finally:
        stop.set()
        t.join()
        agent.close()
        seg.close()
        for p in plugins:
            p.close()


def test_closed_loop_policy_segment_replaced(tmp_path: Path) -> None:
    """ClosedLoopPolicy returns a connection's split once; after segment_replaced() it starts
    the connection again and returns its split, even for the same slot and gen."""
    seg, plugins = _bench(tmp_path, 4)
    try:
        rs = [mpib_agent.ConnRate(seg.connections()[0], 0.0, 0.0, 0.0, 0.0)]
        p = mpib_agent.ClosedLoopPolicy()
        slot = rs[0].slot.index
        assert p(rs) == {slot: 512} and p(rs) == {}
        p.segment_replaced()
        assert p(rs) == {slot: 512}
    finally:
        seg.close()
        for pl in plugins:
            pl.close()
