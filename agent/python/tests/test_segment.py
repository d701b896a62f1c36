from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import mpib_agent
from conftest import VECTORS, fake_register


def test_create_mode_and_header(seg: mpib_agent.Segment) -> None:
    st = os.stat(seg.path)
    assert st.st_mode & 0o777 == 0o600
    h = seg.header()
    assert (h.version, h.nslots, h.npeers, h.total_size) == (1, 8, 4, 256 + 8 * 256 + 4 * 64)


@pytest.mark.parametrize(
    "name,mode,mutate,code",
    [
        ("world-writable", 0o666, None, "bad_mode"),
        ("group-writable", 0o620, None, "bad_mode"),
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
    seg.set_slot_hint(2, 512)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 512, "slot")
    seg.set_slot_hint(2, None)
    seg.set_peer_hint("10.0.2.7", None)
    assert seg.resolve(2) == mpib_agent.Resolution(True, 200, "peer")
    seg.stop_beat()
    assert seg.resolve(2).source == "stale"


def test_clamp_reported(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 0, "10.0.1.2", 0)
    with pytest.warns(mpib_agent.HintClampedWarning) as w:
        assert seg.set_slot_hint(0, 5000) == 1024
    assert w[0].message.requested == 5000  # type: ignore[union-attr]
    assert seg.slot(0).hint.sup_bw == 1024
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert seg.set_class_hint(0, 1024) == 1024


def test_errors(seg: mpib_agent.Segment) -> None:
    for call, code in [
        (lambda: seg.set_slot_hint(1, 1), "slot_inactive"),
        (lambda: seg.set_slot_hint(99, 1), "slot_range"),
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
    seg.set_slot_hint(0, 700)
    fake_register(seg, 0, "10.0.1.2", 0, gen=2)  # a new registration of the slot
    assert not seg.resolve(0).applies


def test_gc(seg: mpib_agent.Segment) -> None:
    fake_register(seg, 0, "10.0.1.2", 0, pid=4000001)
    fake_register(seg, 1, "10.0.1.2", 0)
    assert seg.gc() == [0]
    assert [c.index for c in seg.connections()] == [1]


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
