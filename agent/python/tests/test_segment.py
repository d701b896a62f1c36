from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import pytest

import mpib_agent
from conftest import VECTORS, fake_die, fake_register, fake_release
from mpib_agent._layout import STATE_ACTIVE
from mpib_agent._segment import _lock_byte


def test_create_mode_and_header(seg: mpib_agent.Segment) -> None:
    st = os.stat(seg.path)
    assert st.st_mode & 0o777 == 0o600
    h = seg.header()
    assert (h.version, h.nslots, h.npeers, h.total_size) == (6, 8, 4, 256 + 8 * 384 + 4 * 64)


@pytest.mark.parametrize(
    "name,mode,mutate,code",
    [
        ("world-writable", 0o666, None, "bad_mode"),
        ("group-writable", 0o620, None, "bad_mode"),
        ("world-readable", 0o644, None, "bad_mode"),  # others would see peers and rates
        ("group-readable", 0o640, None, "bad_mode"),
        ("other-executable", 0o601, None, "bad_mode"),
        ("small", 0o600, lambda b: b[:10], "too_small"),
        ("truncated", 0o600, lambda b: b[:300], "too_small"),
        ("magic", 0o600, lambda b: b"X" + b[1:], "bad_magic"),
    ],
)
def test_open_refuses(tmp_path: Path, name: str, mode: int, mutate: object, code: str) -> None:
    data = (VECTORS / "basic.bin").read_bytes()
    if callable(mutate):
        data = mutate(data)
    f = tmp_path / name
    f.write_bytes(data)
    f.chmod(mode)
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.open_segment(str(f))
    assert ei.value.code == code
    assert code in str(ei.value)


def test_open_refuses_other_owner(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    f = tmp_path / "owner"
    f.write_bytes((VECTORS / "basic.bin").read_bytes())
    f.chmod(0o600)
    os.chown(f, 65534, 65534)
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.open_segment(str(f))
    assert ei.value.code == "bad_owner"


def test_not_regular(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.open_segment(str(fifo))
    assert ei.value.code == "not_regular"


def test_hint_levels(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 2, "10.0.2.7", 1)
    fake_register(seg, 3, "10.0.2.8", 1)
    assert seg.resolve(2).source == "stale"
    seg.beat()
    assert seg.resolve(2).source == "no_hint"
    seg.set_class_hint("inter", 100)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 100, "class")
    seg.set_peer_hint("10.0.2.0/24", 200)
    assert seg.resolve(3) == mpib_agent.Resolution(True, 200, "peer")
    seg.set_peer_hint("10.0.2.7", 300)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 300, "peer")
    seg.set_slot_hint(2, 512, gen=1)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 512, "slot")
    seg.set_slot_hint(2, None, gen=1)
    seg.set_peer_hint("10.0.2.7", None)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 200, "peer")
    seg.stop_beat()
    assert seg.resolve(2).source == "stale"


def test_clamp_reported(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 0, "10.0.1.2", 0)
    with pytest.warns(mpib_agent.HintClampedWarning) as w:
        assert seg.set_slot_hint(0, 5000, gen=1) == 1024
    assert w[0].message.requested == 5000  # type: ignore[union-attr]
    assert seg.slot(0).hint.sup_bw == 1024
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seg.set_class_hint(0, 1024) == 1024


def test_errors(seg: mpib_agent.Segment) -> None:
    for call, code in [
        (lambda: seg.set_slot_hint(1, 1, gen=1), "slot_inactive"),
        (lambda: seg.set_slot_hint(99, 1, gen=1), "slot_range"),
        (lambda: seg.set_class_hint("outer", 1), "bad_class"),
        (lambda: seg.set_peer_hint("10.0.0.0/33", 1), "bad_prefix"),
    ]:
        with pytest.raises(mpib_agent.SegmentError) as ei:
            call()
        assert ei.value.code == code
    for i in range(4):
        seg.set_peer_hint(f"1.1.1.{i}", 1)
    with pytest.raises(mpib_agent.SegmentError) as ei:
        seg.set_peer_hint("1.1.1.9", 1)
    assert ei.value.code == "peer_table_full"


def test_gen_binds_hint(seg: mpib_agent.Segment) -> None:
    seg.beat()
    fake_register(seg, 0, "10.0.1.2", 0, gen=1)
    seg.set_slot_hint(0, 700, gen=1)
    fake_register(seg, 0, "10.0.1.2", 0, gen=2)  # a new registration of the slot
    assert not seg.resolve(0).applies


def test_rates_and_policy(seg: mpib_agent.Segment) -> None:
    s = fake_register(seg, 0, "10.0.1.2", 0)
    a = {0: s}
    b_slot = fake_register(seg, 0, "10.0.1.2", 0)
    b_slot.telemetry.sout_bytes, b_slot.telemetry.sup_bytes = 1000, 3000
    rs = mpib_agent.rates(a, {0: b_slot}, 2.0)
    assert len(rs) == 1 and rs[0].sup_bps == 1500 and rs[0].sup_share == 0.75
    p = mpib_agent.Proportional()
    assert p.sup_bw() == 512
    p.observe(rs)
    assert p.sup_bw() == 768
    assert mpib_agent.Proportional(cap_sout=1, cap_sup=0).sup_bw() == 0
    assert mpib_agent.Proportional(cap_sout=0, cap_sup=1).sup_bw() == 1024


def test_gc_lease_not_pid(seg: mpib_agent.Segment) -> None:
    """A plugin in another PID namespace registers with a pid that does not exist
    here; its slot lives as long as its lease (an OFD lock), whatever kill(pid, 0) says."""
    fake_register(seg, 0, "10.0.1.2", 0, pid=4000001)  # live, in a container
    fake_register(seg, 1, "10.0.1.2", 0, pid=4000002, lease=False)  # its process died
    assert seg.lease_held(0) and not seg.lease_held(1)
    assert seg.gc() == [1]
    assert [c.index for c in seg.connections()] == [0]
    fake_die(seg, 0)
    assert seg.gc() == [0]
    assert seg.connections() == []


def test_gc_never_frees_a_reclaimed_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner word (ACTIVE | pid << 32) is not unique per registration: a plugin that
    releases its slot and claims it again writes the same word. Here a live plugin (fixed pid
    37) releases its slot just before the agent's lease check of gc() (whichever lock call
    makes it) and claims it again just after: gc() must free nothing, and a slot the plugin
    holds must read ACTIVE."""
    from mpib_agent import _segment
    from mpib_agent._plugin import ConnDesc, PluginProcess

    agent = mpib_agent.create(str(tmp_path / "hints"), nslots=1, npeers=0)
    plugin = PluginProcess(agent.path, pid=37)  # another process: its own open file description
    slot = plugin.register(ConnDesc(conn_id=1))

    def around_check(real: Callable[..., bool]) -> Callable[..., bool]:
        def check(fd: int, off: int, *rest: int) -> bool:
            if fd != agent._fd or off != _segment.slot_lock_off(slot) or rest[:1] == (fcntl.F_UNLCK,):
                return real(fd, off, *rest)
            if slot in plugin.slots:
                plugin.release(slot)
            r = real(fd, off, *rest)
            try:
                plugin.register(ConnDesc(conn_id=1))
            except mpib_agent.SegmentError as e:
                assert e.code == "slots_full"  # the agent holds the lease
            return r

        return check

    monkeypatch.setattr(_segment, "_lock_held", around_check(_segment._lock_held))
    monkeypatch.setattr(_segment, "_lock_byte", around_check(_segment._lock_byte))
    try:
        assert agent.gc() == []
        if not plugin.slots:  # its claim met the agent's lease: the agent dropped it since
            plugin.register(ConnDesc(conn_id=1))
        for i in plugin.slots:
            s = agent.slot(i)
            assert (s.state, s.owner_pid) == (STATE_ACTIVE, 37), f"the leased slot reads {s}"
    finally:
        plugin.close()
        agent.close()


def test_set_slot_hint_gen_changed(seg: mpib_agent.Segment) -> None:
    """A hint carries the generation the writer read; a slot registered again in
    between refuses it with GenerationChanged (a SegmentError, code gen_changed)."""
    seg.beat()
    s = fake_register(seg, 0, "10.0.1.2", 0, gen=4)
    fake_release(seg, 0)
    fake_register(seg, 0, "10.0.1.9", 0, gen=5)  # another connection took the slot
    with pytest.raises(mpib_agent.GenerationChanged) as ei:
        seg.set_slot_hint(0, 900, gen=s.gen)
    assert (ei.value.code, ei.value.expected, ei.value.current) == ("gen_changed", 4, 5)
    assert isinstance(ei.value, mpib_agent.SegmentError)
    assert not seg.resolve(0).applies
    assert seg.set_slot_hint(0, 900, gen=5) == 900


def test_truncate_under_reader(seg: mpib_agent.Segment) -> None:
    """Truncating the segment (same user, `: > file`) under a reader never crashes
    it: reads give SegmentError("segment_gone"); reattach() follows a re-created segment."""
    fake_register(seg, 3, "10.0.2.7", 1)
    errors: list = []
    gone = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seg.connections()
                seg.resolve(3)
                seg.snapshot()
                seg.beat()
                seg.set_class_hint("inter", 100)
            except mpib_agent.SegmentError as e:
                (gone if e.code == "segment_gone" else errors).append(e)
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    ts = [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    with open(seg.path, "r+b") as f:  # what `: > file` does
        f.truncate(0)
    time.sleep(0.1)
    stop.set()
    for t in ts:
        t.join()
    assert not errors, errors
    assert gone and seg.err() is not None and seg.err().code == "segment_gone"  # type: ignore[union-attr]
    assert os.path.getsize(seg.path) == 0, "a write extended the truncated file"
    assert seg.replaced()
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.create(seg.path, 4, 2)  # the fake plugin still holds its lease on it
    assert ei.value.code == "segment_live"
    mpib_agent.create(seg.path, 4, 2, force=True).close()
    assert seg.reattach() and seg.nslots == 4 and seg.err() is None
    assert not seg.reattach()


def test_create_refuses_live(tmp_path: Path) -> None:
    """Create refuses a live segment unless forced; symlinks are refused; the
    default path is per user."""
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 4, 0).close()
    s = mpib_agent.create(p, 4, 0)  # nobody uses it: replaced
    s.beat()
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.create(p, 4, 0)
    assert ei.value.code == "segment_live"
    s.stop_beat()
    fd = os.open(p, os.O_RDWR)  # a plugin attached: shared lock on byte 0
    assert _lock_byte(fd, 0, fcntl.F_RDLCK)
    lv = mpib_agent.liveness(p)
    assert lv.locked and not lv.heartbeat_fresh and lv.live
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.create(p, 4, 0)
    assert ei.value.code == "segment_live"
    mpib_agent.create(p, 4, 0, force=True).close()
    os.close(fd)
    s.close()
    link = str(tmp_path / "link")
    os.symlink(p, link)
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.open_segment(link)
    assert ei.value.code == "not_regular"
    env = dict(os.environ)
    os.environ.pop("MPIB_SHM_PATH", None)
    try:
        assert mpib_agent.default_path() == f"/dev/shm/mpib-hints-{os.geteuid()}"
    finally:
        os.environ.update(env)
    if os.geteuid() == 0:
        os.lchown(p, 65534, 65534)
        with pytest.raises(mpib_agent.SegmentError) as ei:
            mpib_agent.create(p, 4, 0, force=True)
        assert ei.value.code == "bad_owner"


def test_agent_lock_and_own_heartbeat(seg: mpib_agent.Segment, monkeypatch: pytest.MonkeyPatch) -> None:
    """One beating agent at a time; a stop clears only its own heartbeat; the beat
    period follows MPIB_AGENT_STALE_MS."""
    other = mpib_agent.open_segment(seg.path)
    seg.acquire_agent()
    seg.beat()
    with pytest.raises(mpib_agent.SegmentError) as ei:
        other.acquire_agent()
    assert ei.value.code == "agent_running"
    other.beat(mpib_agent.now_ns() + 1)
    assert not seg.stop_beat()
    assert seg.header().heartbeat_ns != 0
    assert other.stop_beat() and seg.header().heartbeat_ns == 0
    seg.release_agent()
    other.acquire_agent()
    other.close()
    monkeypatch.setenv("MPIB_AGENT_STALE_MS", "200")
    assert mpib_agent.beat_period_s() == 0.05
    monkeypatch.setenv("MPIB_AGENT_STALE_MS", "0")
    assert mpib_agent.stale_ns_from_env() == 500_000_000


def test_run_policy(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 5, "10.0.1.2", 0)
    seen = []

    def policy(rs: list) -> dict:  # type: ignore[type-arg]
        seen.append(len(rs))
        assert seg.agent_alive()
        return {5: 640}

    mpib_agent.run_policy(seg, policy, interval=0.05, duration=0.3)
    assert seen and seg.slot(5).hint.sup_bw == 640
    assert seg.header().heartbeat_ns == 0  # cleared on exit


def test_run_policy_slow_callback_and_vanished_slot(seg: mpib_agent.Segment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The heartbeat has its own thread (it keeps beating through a 0.7 s callback that
    holds the GIL) and a connection that closes during the callback is skipped, not fatal.
    The proof is that the heartbeat value changes while the callback runs, not an age bound:
    how soon the beat thread gets the GIL back is the host's business (a loaded host can delay
    one beat by hundreds of milliseconds), whereas a loop that beats between ticks never
    changes it."""
    monkeypatch.setenv("MPIB_AGENT_STALE_MS", "500")
    fake_register(seg, 1, "10.0.1.2", 0)
    fake_register(seg, 2, "10.0.1.3", 0)
    calls = []
    beats_seen = set()

    def policy(rs: list) -> dict:  # type: ignore[type-arg]
        calls.append(len(rs))
        if len(calls) == 1:
            t_end = time.monotonic() + 0.7
            next_look = 0.0
            while time.monotonic() < t_end:  # a slow policy, holding the GIL in Python code
                sum(range(20000))
                if time.monotonic() >= next_look:  # looking in a tight loop would hold the
                    next_look = time.monotonic() + 0.02  # segment's lock against the beat thread
                    beats_seen.add(seg.header().heartbeat_ns)
            fake_release(seg, 1)  # slot 1's connection closes while the policy runs...
            fake_register(seg, 1, "10.0.1.4", 0, gen=2)  # ...and another takes its slot
        return {1: 100, 2: 200}

    with pytest.warns(mpib_agent.SlotSkippedWarning):
        mpib_agent.run_policy(seg, policy, interval=0.05, duration=1.0)
    assert len(calls) >= 2, calls
    assert len(beats_seen) >= 3, f"the heartbeat did not go on beating during the callback: {sorted(beats_seen)}"
    h1 = seg.slot(1).hint
    assert (h1.gen, h1.sup_bw) == (2, 100)  # refused for gen 1, written for gen 2 at the next tick
    assert seg.slot(2).hint.sup_bw == 200
    assert seg.header().heartbeat_ns == 0


def test_run_policy_refuses_second_agent(seg: mpib_agent.Segment) -> None:
    other = mpib_agent.open_segment(seg.path)
    other.acquire_agent()
    with pytest.raises(mpib_agent.SegmentError) as ei:
        mpib_agent.run_policy(seg, lambda rs: None, interval=0.05, duration=0.1)
    assert ei.value.code == "agent_running"
    other.close()


def _put_rail_bytes(buf: bytearray, off: int, sout: int, sup: int, failovers: int, sout_ns: int, sup_ns: int) -> None:
    """The rail-state telemetry of the slot at ``off``, at the spec's offsets (4.3), by hand."""
    buf[off + 208] = sout
    buf[off + 209] = sup
    buf[off + 212 : off + 216] = failovers.to_bytes(4, "little")
    buf[off + 216 : off + 224] = sout_ns.to_bytes(8, "little")
    buf[off + 224 : off + 232] = sup_ns.to_bytes(8, "little")


def test_rail_state_decode() -> None:
    """sout_state/sup_state (u8 at +208/+209), failovers (u32 at +212) and their change times
    (u64 at +216/+224): names for the states the spec defines, unknown(N) for others."""
    img = bytearray(
        mpib_agent.encode(mpib_agent.Snapshot(header=mpib_agent.Header(total_size=256 + 4 * 384, nslots=4, npeers=0)))
    )
    s1, s2, s3 = (mpib_agent._layout.slot_off(i) for i in (1, 2, 3))
    _put_rail_bytes(img, s1, 1, 2, 5, 1_763_856_000_000_000_001, 0xFFFFFFFFFFFFFFFE)
    _put_rail_bytes(img, s2, 3, 255, 0xFFFFFFFF, 0, 0)
    _put_rail_bytes(img, s3, 0, 0, 2, 10, 20)  # both rails left service and rejoined
    snap = mpib_agent.decode(bytes(img))
    got = {s.index: s.telemetry for s in snap.slots}
    T = mpib_agent.Telemetry
    assert got == {
        1: T(
            sout_state="down",
            sup_state="failed",
            failovers=5,
            sout_state_ns=1_763_856_000_000_000_001,
            sup_state_ns=0xFFFFFFFFFFFFFFFE,
        ),
        2: T(sout_state="unknown(3)", sup_state="unknown(255)", failovers=0xFFFFFFFF),
        3: T(sout_state="up", sup_state="up", failovers=2, sout_state_ns=10, sup_state_ns=20),
    }
    assert mpib_agent.encode(snap) == bytes(img)
    assert mpib_agent.encode(mpib_agent.Snapshot.from_dict(snap.to_dict())) == bytes(img)
    tel = snap.to_dict()["slots"][1]["telemetry"]
    assert {k: tel[k] for k in ("sout_state", "sup_state", "failovers", "sout_state_ns", "sup_state_ns")} == {
        "sout_state": "unknown(3)",
        "sup_state": "unknown(255)",
        "failovers": 4294967295,
        "sout_state_ns": 0,
        "sup_state_ns": 0,
    }


def test_recoveries(tmp_path: Path) -> None:
    """A rail coming back into service counts a recovery (u32 at +236), leaving it a
    failover; a state set again counts nothing; a new claim zeroes both."""
    from mpib_agent._plugin import ConnDesc, PluginProcess

    seg = mpib_agent.create(str(tmp_path / "hints"), nslots=2, npeers=0)
    with PluginProcess(seg.path) as plugin:
        i = plugin.register(ConnDesc(conn_id=1))
        for rail, state in (("sup", 1), ("sup", 2), ("sup", 0), ("sup", 0), ("sout", 1), ("sout", 0)):
            plugin.set_rail_state(i, rail, state, 7)
        t = seg.slot(i).telemetry
        assert (t.failovers, t.recoveries, t.sout_state, t.sup_state) == (2, 2, "up", "up")
        assert os.pread(seg._fd, 4, mpib_agent._layout.slot_off(i) + 236) == (2).to_bytes(4, "little")
        assert seg.snapshot().to_dict()["slots"][0]["telemetry"]["recoveries"] == 2
        plugin.release(i)
        assert plugin.register(ConnDesc(conn_id=1)) == i and seg.slot(i).telemetry.recoveries == 0
    seg.close()


def test_rail_state_names() -> None:
    from mpib_agent._types import rail_state_name, rail_state_value

    for v in range(256):
        assert rail_state_value(rail_state_name(v)) == v
    assert [rail_state_name(v) for v in (0, 1, 2, 9)] == ["up", "down", "failed", "unknown(9)"]
    for bad in ("", "UP", "unknown(1)", "unknown(256)", "unknown(07)", "unknown(-1)", "unknown(9", "unknown()"):
        with pytest.raises(ValueError):
            rail_state_value(bad)


def test_rail_state_live(seg: mpib_agent.Segment) -> None:
    """A plugin's rail-state stores are seen by connections(), slot() and snapshot(); a new
    claim (fake_register writes zero telemetry, as the plugin does) resets them."""
    fake_register(seg, 2, "10.0.2.7", 1)
    off = mpib_agent._layout.slot_off(2)
    fd = os.open(seg.path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([2, 1]), off + 208)
        os.pwrite(fd, (3).to_bytes(4, "little"), off + 212)
        os.pwrite(fd, (111).to_bytes(8, "little") + (222).to_bytes(8, "little"), off + 216)
    finally:
        os.close(fd)
    want = ("failed", "down", 3, 111, 222)
    for t in (seg.connections()[0].telemetry, seg.slot(2).telemetry, seg.snapshot().slots[0].telemetry):
        assert (t.sout_state, t.sup_state, t.failovers, t.sout_state_ns, t.sup_state_ns) == want
    fake_register(seg, 2, "10.0.2.7", 1, gen=2)
    t = seg.slot(2).telemetry
    assert (t.sout_state, t.sup_state, t.failovers, t.sout_state_ns, t.sup_state_ns) == ("up", "up", 0, 0, 0)


def test_version_message() -> None:
    """A segment of another format version is refused saying which side is older: a version 5
    segment (no sup_path), 4 (no recoveries), 3 (no device fields) or 2 (256-byte slots)
    predates this reader, version 7 comes from a newer agent."""
    img = bytearray(
        mpib_agent.encode(mpib_agent.Snapshot(header=mpib_agent.Header(total_size=256 + 4 * 384, nslots=4, npeers=0)))
    )
    for ver, want in (
        (2, "older agent"),
        (3, "older agent"),
        (4, "older agent"),
        (5, "older agent"),
        (7, "newer agent"),
    ):
        img[8:12] = ver.to_bytes(4, "little")
        with pytest.raises(mpib_agent.SegmentError) as ei:
            mpib_agent.decode(bytes(img))
        assert ei.value.code == "bad_version" and want in str(ei.value) and "implements 6" in str(ei.value)


def test_completion_decode() -> None:
    """The completion telemetry at the spec's offsets (4.3): applied_sup_bw u32 at +232,
    flush_wall_ns u64 at +240, then per rail (SOUT at +256, SUP at +288) completed_bytes,
    completed_requests, inflight_bytes, busy_ns, u64 each."""
    img = bytearray(
        mpib_agent.encode(mpib_agent.Snapshot(header=mpib_agent.Header(total_size=256 + 4 * 384, nslots=4, npeers=0)))
    )
    off = mpib_agent._layout.slot_off(2)
    img[off + 232 : off + 236] = (700).to_bytes(4, "little")
    img[off + 240 : off + 248] = (1_763_856_000_000_000_003).to_bytes(8, "little")
    for k, v in enumerate((11, 12, 13, 14, 21, 22, 23, 0xFFFFFFFFFFFFFFFF)):
        img[off + 256 + 8 * k : off + 264 + 8 * k] = v.to_bytes(8, "little")
    snap = mpib_agent.decode(bytes(img))
    assert [s.index for s in snap.slots] == [2]
    assert snap.slots[0].telemetry == mpib_agent.Telemetry(
        applied_sup_bw=700,
        flush_wall_ns=1_763_856_000_000_000_003,
        sout_completed_bytes=11,
        sout_completed_requests=12,
        sout_inflight_bytes=13,
        sout_busy_ns=14,
        sup_completed_bytes=21,
        sup_completed_requests=22,
        sup_inflight_bytes=23,
        sup_busy_ns=0xFFFFFFFFFFFFFFFF,
    )
    assert mpib_agent.encode(snap) == bytes(img)
    r = mpib_agent.rates(
        {2: snap.slots[0]},
        {
            2: mpib_agent.Slot(
                index=2,
                telemetry=mpib_agent.Telemetry(sup_completed_bytes=8021, sup_completed_requests=26, sup_busy_ns=0),
            )
        },
        2.0,
    )
    assert r[0].sup_completed_bps == 4000 and r[0].sup_latency_ns == 0  # busy went backwards: no latency


def test_create_full_file_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without room for the segment fails create() at once with ENOSPC, naming
    the path and the size, and leaves no file behind (neither at the path nor the temporary
    one), instead of a sparse file whose first touch of a page raises SIGBUS."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = str(tmp_path / "hints")
    with pytest.raises(OSError) as ei:
        mpib_agent.create(path, nslots=8, npeers=4)
    size = str(256 + 8 * 384 + 4 * 64)
    assert ei.value.errno == errno.ENOSPC and path in str(ei.value) and size in str(ei.value), ei.value
    assert os.listdir(tmp_path) == []


def test_create_reserves_pages(tmp_path: Path) -> None:
    """The segment file's pages are allocated at create, not left sparse."""
    with mpib_agent.create(str(tmp_path / "hints"), nslots=1024, npeers=256) as s:
        st = os.stat(s.path)
        assert st.st_blocks * 512 >= s.header().total_size, "the file is sparse"


def test_peer_key_masked(seg: mpib_agent.Segment) -> None:
    """A peer key is stored masked to its prefix (spec 5.6): 10.0.2.7/24 and 10.0.2.0/24 name
    one island, so a write or a clear under either spelling updates the one entry (resolution
    masks both keys, and a second entry for the island would lose every tie to the first).
    Go: TestPeerKeyMasked."""
    from mpib_agent._layout import R_PEER_IP, peer_off
    from mpib_agent._policy import parse_peer

    fake_register(seg, 0, "10.0.2.9", 1)

    def resolve() -> mpib_agent.Resolution:
        seg.beat()
        return seg.resolve(0)

    seg.set_peer_hint("10.0.2.7/24", 100)
    assert resolve() == mpib_agent.Resolution(True, 100, "peer", False)
    seg.set_peer_hint("10.0.2.0/24", 900)
    assert resolve() == mpib_agent.Resolution(True, 900, "peer", False)
    seg.set_peer_hint("10.0.2.200", None, prefix_len=24)
    assert resolve().source == "no_hint"
    seg.set_peer_hint("10.0.2.7/24", 300)
    e = seg.snapshot().peers[0].record
    assert (e.peer_ip, e.prefix_len) == ("10.0.2.0", 24)
    assert parse_peer("10.0.2.7/24") == ("10.0.2.0", 24) and parse_peer("10.0.2.7") == ("10.0.2.7", 32)
    # An entry whose key has host bits (an older writer's) is still the island's entry.
    seg._v.put32(peer_off(seg.nslots, 0) + R_PEER_IP, 0x0A000207)
    seg.set_peer_hint("10.0.2.0/24", None)
    assert resolve().source == "no_hint"
