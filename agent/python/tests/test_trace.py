"""Traces (record --raw, replay, plot), scenario files, and the simulator's cached hint read."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

import mpib_agent
from mpib_agent import evaluate, sim, trace
from mpib_agent._cli import main
from mpib_agent._hintcache import CachedResolver
from mpib_agent._plugin import ConnDesc, PluginProcess
from mpib_agent._scenariofile import load_scenario, scenario_from_dict
from mpib_agent._types import SegmentError, Telemetry

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "testdata" / "scenarios" / "example.json"
LAB_TRACE = ROOT / "testdata" / "traces" / "closedloop-lab.jsonl"
ENV = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))


def test_cached_resolver_matches_the_spec_reader(tmp_path: Path) -> None:
    """Every source and change (slot, peer, class hints, a peer entry replaced, a stale
    heartbeat) resolves as Segment.resolve does."""
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 8, 4).close()
    with PluginProcess(p, 4242) as proc, mpib_agent.open_segment(p) as agent:
        slot = proc.register(ConnDesc(conn_id=1, peer_sout_ip="10.0.2.7", path_class=1, is_send=True))
        gen = proc.slots[slot]
        reader = CachedResolver(proc.seg)
        seen: List[str] = []

        def same(now: int) -> None:
            want = agent.resolve(slot, now, 500_000_000)
            assert reader.resolve(slot, now, 500_000_000) == want
            seen.append(want.source)

        now = mpib_agent.now_ns()
        same(now)  # no heartbeat: stale
        agent.beat(now)
        same(now)  # no_hint
        agent.set_class_hint("inter", 100)
        same(now)
        agent.set_peer_hint("10.0.2.0", 200, prefix_len=24)
        same(now)
        agent.set_peer_hint("10.0.2.7", 300)  # a longer prefix: the epoch moves
        same(now)
        agent.set_peer_hint("10.0.2.7", 333)  # the same entry, a new value
        same(now)
        agent.set_peer_hint("10.0.2.7", None)
        same(now)
        agent.set_slot_hint(slot, 700, gen=gen)
        same(now)
        with pytest.warns(mpib_agent.HintClampedWarning):
            agent.set_slot_hint(slot, 2000, gen=gen)
        same(now)
        same(now + 10**10)  # the heartbeat went stale
    assert seen == ["stale", "no_hint", "class", "peer", "peer", "peer", "peer", "slot", "slot", "stale"]


def test_cached_resolver_rescans_after_a_scan_that_skipped_a_busy_entry(tmp_path: Path) -> None:
    """A scan that skipped an entry caught mid-write is incomplete (spec 5.3): its result
    applies but is not cached for its (peers_epoch, gen), so the entry, completed without an
    epoch bump, is found by the next read (the C reader's rule, plugin/mpib_shm_hint.c)."""
    from mpib_agent._layout import R_SEQ, peer_off

    p = str(tmp_path / "hints")
    mpib_agent.create(p, 8, 4).close()
    with PluginProcess(p, 4242) as proc, mpib_agent.open_segment(p) as agent:
        slot = proc.register(ConnDesc(conn_id=1, peer_sout_ip="10.0.2.7", path_class=1, is_send=True))
        reader = CachedResolver(proc.seg)
        agent.set_peer_hint("10.0.2.7", 300)
        e0 = peer_off(agent.nslots, 0)
        seq = agent._v.u32(e0 + R_SEQ)
        agent._v.put32(e0 + R_SEQ, seq + 1)  # a writer is mid-write: the scan skips the entry
        now = mpib_agent.now_ns()
        agent.beat(now)
        assert reader.resolve(slot, now, 500_000_000).source == "no_hint"
        agent._v.put32(e0 + R_SEQ, seq + 2)  # the write completes; the epoch is not bumped
        assert reader.resolve(slot, now, 500_000_000) == mpib_agent.Resolution(True, 300, "peer", False)


def test_example_scenario_file(capsys: pytest.CaptureFixture[str]) -> None:
    sc = sim.scenario(str(EXAMPLE))
    assert sc.name == "example" and len(sc.conns) == 2 and sc.duration == 45
    assert sc.conns[0].sup == sim.Rail(50_000, 20) and sc.conns[1].sout.mbps == 40_000
    assert sc.conns[1].path_class == 1 and sc.conns[1].msg_bytes == 1 << 20 and sc.conns[1].conn_id == 3
    assert sc.events[1] == sim.Event(30, "sup", mbps=150_000, state="up", conn=0)
    rs = evaluate.evaluate(["closed-loop"], [sc], 1, jobs=1)
    assert rs[0].mean > 90  # a file scenario runs like a built-in one


BASE: Dict[str, Any] = {"duration": 10, "conns": [{"sout": {"gbps": 100}, "sup": {"gbps": 50}}]}


@pytest.mark.parametrize(
    "patch, msg",
    [
        ({"conns": []}, "conns: want a non-empty list"),
        ({"durration": 3}, "unknown key 'durration'"),
        ({"duration": 0}, "duration: want a number > 0"),
        ({"conns": [{"sout": {"gbps": 100}}]}, "conns[0]: want the sup rail"),
        ({"conns": [{"sout": {"gbps": "fast"}, "sup": {"gbps": 1}}]}, "conns[0].sout.gbps: want a number >= 0"),
        ({"conns": [{"sout": {"gbps": 1, "mbps": 1}, "sup": {"gbps": 1}}]}, "conns[0].sout: give mbps or gbps"),
        ({"conns": [{"sout": {}, "sup": {"gbps": 1}}]}, "conns[0].sout: want the rail's capacity"),
        ({"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "path_class": "far"}]}, "path_class: want one of intra"),
        ({"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "msg_bytes": 0}]}, "msg_bytes: want an integer > 0"),
        ({"events": [{"t": 20, "rail": "sup", "gbps": 1}]}, "events[0].t: 20 is after the scenario's end"),
        ({"events": [{"t": 2, "rail": "sup"}]}, "events[0]: an event changes mbps"),
        ({"events": [{"t": 2, "rail": "rail3", "gbps": 1}]}, "events[0].rail: want one of sout, sup"),
        ({"events": [{"t": 2, "rail": "sup", "state": "gone"}]}, "events[0].state: want one of up, down, failed"),
        ({"events": [{"t": 2, "rail": "sup", "gbps": 1, "conn": 1}]}, "events[0].conn: connection 1"),
        ({"noise": 2.01}, "noise: want a number from 0 to 2, got 2.01"),
        ({"noise": 1000}, "noise: want a number from 0 to 2, got 1000"),
        ({"sup_relay": "yes"}, "sup_relay: want true or false"),
        (
            {"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "peer": "foo"}]},
            'conns[0].peer: want an IPv4 address (10.0.2.7), got "foo"',
        ),
        (
            {"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "peer": "10.0.2.256"}]},
            "conns[0].peer: want an IPv4 address",
        ),
        ({"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "peer": 7}]}, "conns[0].peer: want a string"),
        (
            {"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "process": 4294963054}]},
            "conns[0].process: want an integer 0..4294963053, got 4294963054",
        ),
        (
            {"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "conn_id": 18446744073709551616}]},
            "conns[0].conn_id: want an integer 0..18446744073709551615, got 18446744073709551616",
        ),
        (
            {"conns": [{"sout": {"gbps": 1}, "sup": {"gbps": 1}, "msg_bytes": 10**400}]},
            "conns[0].msg_bytes: want an integer 0..9007199254740991",
        ),
        (
            {"conns": [{"sout": {"gbps": 1e308}, "sup": {"gbps": 1}}]},
            "conns[0].sout.gbps: want a finite rate, got 1e+308",
        ),
        ({"events": [{"t": 2, "rail": "sup", "gbps": 1e308}]}, "events[0].gbps: want a finite rate"),
    ],
)
def test_scenario_file_errors(patch: Dict[str, Any], msg: str) -> None:
    with pytest.raises(SegmentError) as e:
        scenario_from_dict(dict(BASE, **patch), "s.json")
    assert e.value.code == "bad_scenario" and msg in str(e.value) and "s.json" in str(e.value)


def test_scenario_file_limits() -> None:
    """The largest process and conn_id that fit the plugin's fields are taken as they are."""
    top = (1 << 32) - 1 - sim.PID_BASE
    conn = {"sout": {"gbps": 1}, "sup": {"gbps": 1}, "process": top, "conn_id": (1 << 64) - 1, "peer": "10.0.2.7"}
    sc = scenario_from_dict(dict(BASE, conns=[conn]), "s.json")
    assert (sc.conns[0].process, sc.conns[0].conn_id, sc.conns[0].peer) == (top, (1 << 64) - 1, "10.0.2.7")


def test_scenario_file_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    peer = tmp_path / "peer.json"
    peer.write_text('{"conns":[{"sout":{"gbps":1},"sup":{"gbps":1},"peer":"foo"}]}')
    assert main(["sim", "--path", str(tmp_path / "h"), "--scenario", str(peer)]) == 2
    assert "conns[0].peer: want an IPv4 address" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for arg, msg in ((str(bad), "not JSON"), (str(tmp_path / "none.json"), "cannot read it")):
        assert main(["sim", "--path", str(tmp_path / "h"), "--scenario", arg]) == 2
        err = capsys.readouterr().err
        assert "sim: usage: --scenario" in err and msg in err, err
    with pytest.raises(SegmentError, match="not JSON"):
        load_scenario(str(bad))


def test_lab_trace_scenario() -> None:
    tr = trace.read_trace(str(LAB_TRACE))
    # Recorded once by TestRecordLabTrace: the lab's shaping as capacity points (a1's clock),
    # SOUT 12.5 Mbit/s throughout, SUP 25 -> 6.25 -> 25 Mbit/s.
    assert "recorded in the lab" in tr.header["comment"] and tr.duration > 40
    sc = trace.trace_scenario(tr)
    assert sc.conns[0].sout.mbps == 12.5 and sc.conns[0].sup.mbps == 25 and sc.conns[0].msg_bytes == 512 << 10
    assert [(e.rail, e.mbps) for e in sc.events] == [("sup", 6.25), ("sup", 25)]
    assert 0 < sc.events[0].t < sc.events[1].t < tr.duration


TRUTH = '{"t": 0, "conns": [{"is_send": 1, "truth": {"sup_mbps": 5, %s}}]}'
END = '{"t": 5}'


@pytest.mark.parametrize(
    "lines, msg",
    [
        (['{"t": 0, "sout_mbps": 1, "sup_mbps": 1}', '{"t": -1, "sup_mbps": 2}'], ":2: t -1 goes back"),
        (['{"t": 0, "sout_mbps": "x", "sup_mbps": 1}'], ":1: sout_mbps: want Mbit/s"),
        (['{"t": 0, "sout_mbps": 1, "sup_mbps": 1, "sup_state": "off"}'], ":1: sup_state: want one of up"),
        (['{"comment": "x", "speed": 2}'], ":1: a header line (no t) takes"),
        (["[1, 2]"], ":1: want a JSON object"),
        (['{"t": 0}', '{"t": 5}'], "no capacities"),
        (['{"t": 0, "sout_mbps": 1}', '{"t": 5}'], "must give sout_mbps and sup_mbps"),
        (['{"t": 0, "sout_mbps": 1, "sup_mbps": 1}'], "lasts 0 s"),
        (['{"t": 0, "sout_mbps": 1, "sup_mbps": 1, "sup_gbps": 1}'], ":1: a capacity point takes t, sout_mbps"),
        (
            ['{"noise": 1000}', '{"t": 0, "sout_mbps": 1, "sup_mbps": 1}', '{"t": 5}'],
            "header noise: want a number from 0 to 2",
        ),
        (['{"t": 0, "conns": "abc"}', END], ':1: conns: want a list of objects (record --raw), got "abc"'),
        (['{"t": 0}', '{"t": 1, "conns": [1, 2]}'], ":2: conns: want a list of objects (record --raw), got [1, 2]"),
        ([TRUTH % '"sout_mbps": "x"', END], ':1: conns[0].truth.sout_mbps: want Mbit/s >= 0, got "x"'),
        ([TRUTH % '"sout_mbps": -5', END], ":1: conns[0].truth.sout_mbps: want Mbit/s >= 0, got -5"),
        (
            [TRUTH % '"sout_mbps": 5, "sup_state": "off"', END],
            ':1: conns[0].truth.sup_state: want one of up, down, failed, got "off"',
        ),
        (['{"t": 0, "conns": [{"is_send": 1, "truth": 7}]}', END], ":1: conns[0].truth: want an object, got 7"),
    ],
)
def test_trace_errors(tmp_path: Path, lines: List[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(SegmentError) as e:
        trace.trace_scenario(trace.read_trace(str(f)))
    assert e.value.code == "bad_trace" and msg in str(e.value), str(e.value)
    assert main(["replay", str(f)]) == 1  # a failed operation, said in one line
    assert capsys.readouterr().err.startswith("mpib-agent-py replay: bad_trace: ")


def test_recorded_trace_replays(tmp_path: Path) -> None:
    """A run recorded on the virtual clock carries the raw counters and the truth; replayed,
    its capacities come back from the truth and score like the original run."""
    out = io.StringIO()
    sc = sim.scenario("shift")
    pct = trace.simulate(sc, mpib_agent.ClosedLoopPolicy(), 3, record=out)
    f = tmp_path / "shift.jsonl"
    f.write_text(out.getvalue())
    tr = trace.read_trace(str(f))
    assert len(tr.records) == 180 and tr.duration == pytest.approx(89.5)
    c = tr.records[-1]["conns"][0]
    assert set(c["raw"]) == {x.name for x in dataclasses.fields(Telemetry)}
    assert c["truth"]["sout_mbps"] == 50_000 and c["truth"]["opt_sup_bw"] == 341
    rs = trace.trace_scenario(tr)
    assert [(round(e.t, 1), e.rail, e.mbps) for e in rs.events] == [(29.5, "sup", 25_000), (59.5, "sout", 50_000)]
    assert abs(trace.simulate(rs, mpib_agent.ClosedLoopPolicy(), 3) - pct) < 2.0


def test_recording_replays_with_its_model(tmp_path: Path) -> None:
    """A recording's header carries its model (message size, latencies, noise), so 4to1
    (1 MiB messages, 20 us on SOUT) replays as it ran: with the defaults (512 KiB, 5 us) its
    vanilla run scored 29.3 live and 24.5 replayed."""
    out = io.StringIO()
    live = trace.simulate(sim.scenario("4to1"), evaluate.vanilla(), 1, record=out)
    head = json.loads(out.getvalue().splitlines()[0])
    assert head == {
        "comment": "simulated: scenario 4to1",
        "msg_bytes": 1 << 20,
        "sout_latency_us": 20.0,
        "sup_latency_us": 5.0,
        "noise": 0.03,
    }
    f = tmp_path / "4to1.jsonl"
    f.write_text(out.getvalue())
    replayed = trace.simulate(trace.trace_scenario(trace.read_trace(str(f))), evaluate.vanilla(), 1)
    assert abs(replayed - live) < 0.5, (live, replayed)


def test_record_raw_with_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """record --raw beside a real-time `sim`: every counter and the simulator's truth."""
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
            "2to1",
            "--duration",
            "0",
            "--speed",
            "2",
        ],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(sim.truth_path(p)) and time.monotonic() < deadline:
            time.sleep(0.02)
        out = tmp_path / "rec.jsonl"
        assert main(["record", "--raw", "--path", p, "--out", str(out), "--count", "2", "--interval", "0.2"]) == 0
    finally:
        simp.terminate()
        simp.communicate(timeout=10)
    assert not os.path.exists(sim.truth_path(p))  # the simulator removes it at its end
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    conns = recs[-1]["conns"]
    assert len(conns) == 3 and all(set(c["raw"]) >= {"sout_completed_bytes", "sup_active_ns"} for c in conns)
    truth = {c["conn_id"]: c["truth"] for c in conns}
    assert truth[0]["sout_mbps"] == 2 * 100_000 and truth[0]["opt_sup_bw"] == 683 and truth[7]["opt_sup_bw"] == 341
    assert main(["record", "--raw", "--format", "csv", "--path", p, "--out", str(out)]) == 2
    assert "--raw writes jsonl" in capsys.readouterr().err


def test_plot_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib not installed (pip install mpib-agent[plot])")
    rec = tmp_path / "rec.jsonl"
    with rec.open("w") as out:
        trace.simulate(sim.scenario("fail"), mpib_agent.ClosedLoopPolicy(), 1, record=out)
    for src in (rec, LAB_TRACE):
        png = tmp_path / (src.stem + ".png")
        assert main(["plot", str(src), "-o", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert capsys.readouterr().out.count("plot: ") == 2


def test_plot_without_matplotlib(tmp_path: Path) -> None:
    code = (
        "import sys\nsys.modules['matplotlib'] = None  # as if not installed\n"
        "from mpib_agent._cli import main\n"
        f"sys.exit(main(['plot', {str(LAB_TRACE)!r}, '-o', {str(tmp_path / 'x.png')!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "pip install mpib-agent[plot]" in r.stderr, r.stderr
    assert not (tmp_path / "x.png").exists()
