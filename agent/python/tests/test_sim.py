"""The simulator: a plugin's role on a real segment (registration, leases, hint reads,
telemetry, rail states), its model, and its CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpib_agent
from mpib_agent import sim, trace
from mpib_agent._cli import main
from mpib_agent._plugin import ConnDesc, PluginProcess

ENV = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))


def test_plugin_registration(tmp_path: Path) -> None:
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 4, 0).close()
    with mpib_agent.open_segment(p) as agent:
        assert not mpib_agent.liveness(p).locked
        plug = PluginProcess(p, pid=77)
        assert mpib_agent.liveness(p).locked  # the attach lock
        i = plug.register(ConnDesc(conn_id=5, peer_sout_ip="10.0.2.9"))
        s = agent.slot(i)
        assert (s.state, s.gen, s.pid, s.conn_id, s.peer_sout_ip, s.peer_island, s.is_send) == (
            2,
            1,
            77,
            5,
            "10.0.2.9",
            "10.0.2.0",
            1,
        )
        assert agent.lease_held(i) and agent.gc() == []  # a live lease is never reclaimed
        plug.set_rail_state(i, "sup", 1, 123)
        plug.set_rail_state(i, "sup", 2, 124)  # down -> failed is not another failover
        t = agent.slot(i).telemetry
        assert (t.sup_state, t.sup_state_ns, t.failovers) == ("failed", 124, 1)
        plug.release(i)
        assert agent.slot(i).state == 0 and not agent.lease_held(i)
        j = plug.register(ConnDesc(conn_id=5))
        assert j == i and agent.slot(j).gen == 2 and agent.slot(j).telemetry.failovers == 0  # telemetry restarts
        for k in range(3):
            plug.register(ConnDesc(conn_id=10 + k))
        with pytest.raises(mpib_agent.SegmentError) as ei:
            plug.register(ConnDesc(conn_id=20))
        assert ei.value.code == "slots_full"
        plug.close()
        assert agent.connections() == [] and not mpib_agent.liveness(p).locked
        plug = PluginProcess(p)
        plug.register(ConnDesc(conn_id=1))
        os.close(plug.seg._fd)  # the process dies: its lease goes with it
        plug.seg._fd = -1
        assert len(agent.gc()) == 1


def test_hints_and_telemetry(tmp_path: Path) -> None:
    p = str(tmp_path / "hints")
    with sim.Simulator("fail", p, seed=3, nslots=8, npeers=2) as sm, mpib_agent.open_segment(p) as agent:
        assert sm.created
        c = sm.conns[0]
        sm.advance(1.0)  # no agent: stale, vanilla (intra-island: all SUP)
        s = agent.slot(c.slot)
        assert s.telemetry.sout_bytes == 0 and s.telemetry.sup_bytes > 0 and s.telemetry.reads_stale > 0
        assert c.split == 1024
        sm.agent = agent
        agent.set_class_hint("intra", 300)
        sm.advance(1.0)
        t = agent.slot(c.slot).telemetry
        assert (t.last_sup_bw, mpib_agent._layout.SOURCES[t.last_source], t.reads_applied > 0) == (300, "class", True)
        agent.set_slot_hint(c.slot, 683, gen=c.gen)
        before = agent.slot(c.slot).telemetry
        sm.advance(1.0)
        t = agent.slot(c.slot).telemetry
        gbps = (t.sout_bytes + t.sup_bytes - before.sout_bytes - before.sup_bytes) * 8 / 1e9
        assert 280 < gbps < 320  # ~300 Gb/s at the best split of 100 + 200 Gb/s
        assert abs((t.sup_bytes - before.sup_bytes) / (t.sout_bytes - before.sout_bytes) - 683 / 341) < 0.01
        assert abs((t.sup_requests - before.sup_requests) - (t.sout_requests - before.sout_requests)) <= 1
        sm.advance(27.5)  # SUP goes down at 30 s: all on SOUT whatever the hint
        t = agent.slot(c.slot).telemetry
        assert (t.sup_state, t.failovers, c.split, c.optimum()) == ("down", 1, 0, (0, pytest.approx(12.5e9, rel=0.03)))
        assert t.sup_state_ns > 0
        sm.advance(15.0)
        assert agent.slot(c.slot).telemetry.sup_state == "up" and c.split == 683
    with mpib_agent.open_segment(p) as agent:
        assert agent.connections() == []  # released at close


def test_model() -> None:
    r100, r200 = sim.Rail(100_000.0, 0.0), sim.Rail(200_000.0, 0.0)
    assert sim.optimum(r100, r200, (True, True), 3 << 20)[0] == 683
    assert sim.optimum(r100, r200, (True, False), 3 << 20) == (0, pytest.approx(12.5e9))
    assert sim.msg_time(r100, r200, (False, True), 1 << 20, 0) == float("inf")
    assert sim.optimum(r100, r200, (False, False), 1 << 20) == (0, 0.0)
    with pytest.raises(mpib_agent.SegmentError):
        sim.scenario("nope")
    assert list(sim.SCENARIOS) == ["equal", "2to1", "4to1", "fail", "shift"]


def _static_half(rates):  # type: ignore[no-untyped-def]
    """The exact optimum on equal rails: every send connection at 512."""
    return {r.slot.index: 512 for r in rates if r.slot.is_send == 1}


def test_noise_is_mean_one() -> None:
    """The noise is a mean-one factor on the rate: the static optimum scores about 100 % of
    the noise-free optimum at noise 0.5 (exp(sd*Z) dividing the time scored exp(sd**2/2),
    112 %). 3 seeds of 300 s are 90000 ticks: the mean factor's sd is
    sqrt((exp(0.25) - 1) / 90000) = 0.18 %, and the first interval at vanilla costs 0.08 %,
    so 100.5 lies three sds above the expectation."""
    sc = dataclasses.replace(sim.scenario("equal"), noise=0.5, duration=300)
    pct = sum(trace.simulate(sc, _static_half, seed) for seed in (1, 2, 3)) / 3
    assert 99.0 <= pct <= 100.5, pct


def test_noise_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Noise above NOISE_MAX is refused where a scenario comes in (exp overflowed at 1000)."""
    big = dataclasses.replace(sim.scenario("equal"), noise=1000.0)
    with pytest.raises(ValueError, match="noise 1000.0: want 0..2"):
        sim.Simulator(big, str(tmp_path / "hints"))
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"noise": 2.5, "conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}}]}))
    for cmd in (["sim", "--path", str(tmp_path / "h"), "--scenario"], ["evaluate", "--seeds", "1", "--scenarios"]):
        assert main(cmd + [str(f)]) == 2
        assert "noise: want a number from 0 to 2, got 2.5" in capsys.readouterr().err
    f.write_text(json.dumps({"noise": 2, "duration": 1, "conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}}]}))
    assert main(["evaluate", "--policy", "vanilla", "--seeds", "1", "--jobs", "1", "--scenarios", str(f)]) == 0
    capsys.readouterr()


def test_inter_island_guard(tmp_path: Path) -> None:
    """Without sup_relay an inter-island connection's SUP carries nothing whatever the hint
    (the plugin's guard), and its optimum is all SOUT; with sup_relay the hint applies."""
    example = Path(__file__).resolve().parents[3] / "testdata" / "scenarios" / "example.json"
    for relay, want in ((False, 0), (True, 512)):
        sc = dataclasses.replace(sim.scenario(str(example)), sup_relay=relay)
        p = str(tmp_path / f"hints-{relay}")
        with sim.Simulator(sc, p, seed=1, nslots=16, npeers=0) as sm, mpib_agent.open_segment(p) as agent:
            sm.agent = agent
            inter = sm.conns[1]
            assert inter.spec.path_class == 1
            agent.set_slot_hint(inter.slot, 512, gen=inter.gen)
            sm.advance(1.0)
            tel = next(s for s in agent.connections() if s.index == inter.slot).telemetry
            assert (inter.split, inter.optimum()[0], tel.applied_sup_bw) == (want, want, want), relay
            assert (tel.sup_bytes > 0) == relay and tel.last_sup_bw == 512
            assert inter.delivered == pytest.approx(inter.optimal, rel=0.05)  # the split in force is the best


def test_multi_processes(tmp_path: Path) -> None:
    p = str(tmp_path / "hints")
    with sim.Simulator("2to1", p, seed=1, nslots=16, npeers=0) as sm, mpib_agent.open_segment(p) as agent:
        sm.advance(0.5)
        conns = agent.connections()
        assert sorted((s.pid, s.conn_id, s.is_send) for s in conns) == [(4242, 0, 1), (4243, 7, 1), (4243, 8, 0)]
        assert all(s.telemetry.sup_bytes > 0 for s in conns)  # no agent: vanilla intra-island, all SUP


def test_sim_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = str(tmp_path / "hints")
    for args, msg in (
        (["--scenario", "nope"], "want one of equal, 2to1, 4to1, fail, shift"),
        ([], "give --scenario"),
        (["--scenario", "equal", "--speed", "0"], "--speed '0'"),
        (["--scenario", "equal", "--speed", "-2"], "--speed '-2'"),
        (["--scenario", "equal", "--speed", "x"], "--speed 'x'"),
        (["--scenario", "equal", "--duration", "-1"], "--duration '-1'"),
        (["--scenario", "equal", "--duration", "1 s"], "--duration '1 s'"),
        (["--scenario", "equal", "--seed", "1.5"], "--seed '1.5'"),
    ):
        assert main(["sim", "--path", p] + args) == 2, args
        err = capsys.readouterr().err
        assert "mpib-agent-py sim: usage:" in err and msg in err, (args, err)
    assert not os.path.exists(p)
    assert main(["sim", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in sim.SCENARIOS)
    bad = tmp_path / "bad"
    bad.write_bytes(b"x" * 300)
    bad.chmod(0o600)
    assert main(["sim", "--path", str(bad), "--scenario", "equal", "--duration", "0.1"]) == 1
    assert "bad_magic" in capsys.readouterr().err


def test_run_closed_loop_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 4, 0).close()
    for args, msg in (
        (["--step", "0"], "--step '0': want an integer 1..256"),
        (["--step", "257"], "--step '257'"),
        (["--step", "8.5"], "--step '8.5'"),
        (["--interval", "0"], "--interval '0'"),
        (["--policy", "nope"], "want static, proportional or closed-loop"),
    ):
        a = ["run", "--path", p, "--policy", "closed-loop"] + args
        assert main(a) == 2, a
        assert msg in capsys.readouterr().err
    assert main(["run", "--path", p, "--policy", "proportional", "--step", "8"]) == 2
    assert "--step goes with --policy closed-loop" in capsys.readouterr().err


def test_sim_cli_with_agent(tmp_path: Path) -> None:
    """The real-time simulator and `run --policy closed-loop`, two processes."""
    p = str(tmp_path / "hints")
    simp = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mpib_agent",
            "sim",
            "--path",
            p,
            "--scenario",
            "fail",
            "--duration",
            "0",
            "--speed",
            "4",
            "--seed",
            "1",
        ],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    agent = None
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(p) and time.monotonic() < deadline:
            time.sleep(0.02)
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpib_agent",
                "run",
                "--policy",
                "closed-loop",
                "--path",
                p,
                "--interval",
                "0.1",
                "--step",
                "64",
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)
        with mpib_agent.open_segment(p) as seg:
            c = seg.connections()[0]
            assert mpib_agent._layout.SOURCES[c.telemetry.last_source] == "slot" and c.telemetry.reads_applied > 0
    finally:
        for proc in (agent, simp):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
    assert agent is not None
    out, err = agent.communicate(timeout=10)
    assert agent.returncode == 0, err
    assert "closed-loop: slot" in out and "sup_bw 512 -> " in out  # it moved (which way: the virtual-clock tests)
    out, err = simp.communicate(timeout=10)
    assert simp.returncode == 0, err
    assert "sim: scenario fail" in out and "of the optimum" in out
    with mpib_agent.open_segment(p) as seg:
        assert seg.connections() == []


def test_follows_replaced_segment(tmp_path: Path) -> None:
    """A segment replaced at the path (create --force): the real-time simulator registers its
    connections there again, as the plugin's watcher does, and watch() follows."""
    import threading

    p = str(tmp_path / "hints")
    stop = threading.Event()
    notes: list = []  # type: ignore[type-arg]
    with sim.Simulator("equal", p, seed=1, nslots=8, npeers=0) as sm:
        t = threading.Thread(target=sm.run, kwargs={"duration": 0, "stop": stop, "note": notes.append})
        t.start()
        try:
            w = mpib_agent.watch(p, 0.1)
            assert len(next(w)["conns"]) == 1
            mpib_agent.create(p, 4, 0, force=True).close()
            deadline = time.monotonic() + 5
            while not any("replaced" in n for n in notes) and time.monotonic() < deadline:
                time.sleep(0.02)
            with mpib_agent.open_segment(p) as seg:
                assert seg.nslots == 4 and len(seg.connections()) == 1
            for _ in range(3):
                s = next(w)
            assert len(s["conns"]) == 1 and s["conns"][0]["sout_mbps"] + s["conns"][0]["sup_mbps"] > 0
            w.close()
        finally:
            stop.set()
            t.join()


def test_completion_telemetry(tmp_path: Path) -> None:
    """The simulator publishes the plugin's completion telemetry from its rail model, so
    an agent reads the same fields against it as against a live plugin: per rail completed
    bytes at the modelled rate, the completion latency, one message's part in flight, the
    split applied, the wall clock of the flush; nothing more on a rail once it is down."""
    p = str(tmp_path / "hints")
    msg = 4 << 20
    sc = sim.Scenario(
        "t",
        "test",
        (
            sim.Conn(sim.Rail(10_000.0, 20.0), sim.Rail(30_000.0, 50.0), path_class=1, msg_bytes=msg),
            sim.Conn(sim.Rail(10_000.0), sim.Rail(10_000.0), is_send=False),
        ),
        (sim.Event(2.0, "sup", state="down"),),
        noise=0.0,
        sup_relay=True,  # conn 0 is inter-island: SUP carries its share only through a relay
    )
    with sim.Simulator(sc, p, nslots=8, npeers=0) as sm, mpib_agent.open_segment(p) as agent:
        sm.agent = agent
        agent.set_class_hint("inter", 512)
        c = sm.conns[0]
        sm.advance(0.5)
        a = {s.index: s for s in agent.connections()}
        sm.advance(1.0)
        b = {s.index: s for s in agent.connections()}
        r = [x for x in mpib_agent.rates(a, b, 1.0) if x.slot.index == c.slot][0]
        t_sout, t_sup = 20e-6 + msg / 2 * 8 / 10e9, 50e-6 + msg / 2 * 8 / 30e9
        assert r.sout_completed_bps == pytest.approx(msg / 2 / t_sout, rel=0.01)
        assert r.sup_completed_bps == pytest.approx(msg / 2 / t_sout, rel=0.01)
        assert r.sout_latency_ns == pytest.approx(t_sout * 1e9, rel=0.01)
        assert r.sup_latency_ns == pytest.approx(t_sup * 1e9, rel=0.01)
        t = b[c.slot].telemetry
        assert (t.sout_inflight_bytes, t.sup_inflight_bytes, t.applied_sup_bw) == (msg // 2, msg // 2, 512)
        assert t.flush_wall_ns == sm.realtime_ns() and 0 <= t.sout_bytes - t.sout_completed_bytes <= msg // 2 + 1
        recv = b[sm.conns[1].slot].telemetry
        assert recv.sout_bytes + recv.sup_bytes > 0 and recv.sout_completed_bytes == recv.sup_completed_bytes == 0
        assert recv.flush_wall_ns == 0
        sm.advance(1.0)  # SUP goes down at 2 s: everything on SOUT
        a = {s.index: s for s in agent.connections()}
        sm.advance(1.0)
        b = {s.index: s for s in agent.connections()}
        r = [x for x in mpib_agent.rates(a, b, 1.0) if x.slot.index == c.slot][0]
        t = b[c.slot].telemetry
        assert r.sup_completed_bps == 0 and r.sup_latency_ns == 0 and t.sup_inflight_bytes == 0
        assert (t.applied_sup_bw, t.sout_inflight_bytes) == (0, msg)
