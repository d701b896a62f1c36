from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mpib_agent
from conftest import fake_register, fake_release
from mpib_agent._cli import main

ENV = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = str(tmp_path / "hints")
    assert main(["create", "--path", p, "--slots", "4", "--peers", "2"]) == 0
    with mpib_agent.open_segment(p) as seg:
        fake_register(seg, 1, "10.0.2.7", 1)
        seg.beat()
        assert main(["create", "--path", p]) == 1  # live (beating, a plugin leases a slot)
        assert "segment_live" in capsys.readouterr().err
        assert main(["set", "--path", p, "--conn", "1", "--sup-bw", "512"]) == 0
        assert seg.resolve(1).sup_bw == 512
        assert main(["set", "--path", p, "--conn", f"{os.getpid()}:1", "--clear"]) == 0
        assert main(["set", "--path", p, "--class", "inter", "--sup-bw", "5000"]) == 0
        assert seg.resolve(1) == mpib_agent.Resolution(True, 1024, "class")
        err = capsys.readouterr().err
        assert "clamped to 1024" in err
        assert main(["set", "--path", p, "--conn", "3", "--sup-bw", "1"]) == 1
        assert main(["set", "--path", p, "--conn", "1", "--gen", "7", "--sup-bw", "1"]) == 1
        assert "gen_changed" in capsys.readouterr().err
        assert main(["set", "--path", p, "--sup-bw", "1"]) == 2
        assert main(["list", "--path", p, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out[0]["effective"] == {"applies": True, "sup_bw": 1024, "source": "class", "clamped": False}
        assert main(["list", "--path", p]) == 0
        out = capsys.readouterr().out
        assert "10.0.2.7" in out and " up/up " in out and "RAILS FAILOVERS" in out
        fd = os.open(p, os.O_RDWR)  # the plugin: SUP failed over, SOUT in a state unknown here
        os.pwrite(
            fd,
            bytes([7, 1, 0, 0])
            + (1).to_bytes(4, "little")
            + (5).to_bytes(8, "little")
            + (1_763_856_000_123_456_789).to_bytes(8, "little"),
            mpib_agent._layout.slot_off(1) + 208,
        )
        os.close(fd)
        assert main(["list", "--path", p, "--json"]) == 0
        tel = json.loads(capsys.readouterr().out)[0]["telemetry"]
        assert {k: tel[k] for k in ("sout_state", "sup_state", "failovers", "sout_state_ns", "sup_state_ns")} == {
            "sout_state": "unknown(7)",
            "sup_state": "down",
            "failovers": 1,
            "sout_state_ns": 5,
            "sup_state_ns": 1_763_856_000_123_456_789,
        }
        assert main(["list", "--path", p]) == 0
        assert " unknown(7)/down         1" in capsys.readouterr().out
        assert main(["top", "--path", p, "--count", "1", "--interval", "50ms", "--plain"]) == 0
        assert "SUP Gb/s" in capsys.readouterr().out


def test_refuses_bad_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad"
    f.write_bytes(b"garbage" * 100)
    f.chmod(0o600)
    assert main(["list", "--path", str(f)]) == 1
    assert "bad_magic" in capsys.readouterr().err


def test_kill_goes_stale(tmp_path: Path) -> None:
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 4, 0).close()
    with mpib_agent.open_segment(p) as seg:
        for sig in (signal.SIGKILL, signal.SIGTERM):
            proc = subprocess.Popen(
                [sys.executable, "-m", "mpib_agent", "heartbeat", "--path", p], env=ENV, stdout=subprocess.DEVNULL
            )
            deadline = time.monotonic() + 10
            while not seg.agent_alive(500_000_000) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            assert seg.agent_alive(500_000_000)
            proc.send_signal(sig)
            proc.wait(10)
            if sig == signal.SIGTERM:
                assert seg.header().heartbeat_ns == 0
            time.sleep(0.6)
            assert not seg.agent_alive(500_000_000)


def _wait(cond, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_run_static_weights(tmp_path: Path) -> None:
    """A half-saved weights file keeps the last good weights (warning, the
    loop goes on); a key deleted from the file clears its hint; a conns entry reaches a
    connection that appears later."""
    p, w = str(tmp_path / "hints"), tmp_path / "w.json"
    mpib_agent.create(p, 8, 4).close()

    def write(s: str, n: int) -> None:
        w.write_text(s)
        os.utime(w, ns=(n * 10**9, n * 10**9))

    write('{"class": {"inter": 100}, "peers": {"10.0.2.0/24": 300}}', 1)
    with mpib_agent.open_segment(p) as seg:
        fake_register(seg, 1, "10.0.2.7", 1)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mpib_agent",
                "run",
                "--policy",
                "static",
                "--file",
                str(w),
                "--path",
                p,
                "--interval",
                "50ms",
            ],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _wait(lambda: seg.resolve(1) == mpib_agent.Resolution(True, 300, "peer"), "the peer default")
            write('{"class": {"inter": 100}, "peers": {"10.0.2.0/24": 3', 2)  # half saved
            time.sleep(0.3)
            assert proc.poll() is None, proc.communicate()
            assert seg.resolve(1) == mpib_agent.Resolution(True, 300, "peer")
            write('{"class": {"inter": 100}, "conns": {"2": 700}}', 3)  # peer key deleted
            _wait(lambda: seg.resolve(1) == mpib_agent.Resolution(True, 100, "class"), "the deleted peer key cleared")
            fake_register(seg, 2, "10.0.2.8", 1)  # connects later
            _wait(lambda: seg.resolve(2) == mpib_agent.Resolution(True, 700, "slot"), "the conns entry")
            write('{"class": {"inter": 100}}', 4)  # conns key deleted
            _wait(lambda: seg.resolve(2) == mpib_agent.Resolution(True, 100, "class"), "the deleted conns key cleared")
            fake_release(seg, 2)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert "keeping the last good weights" in err
        assert seg.header().heartbeat_ns == 0


def test_file_errors_name_no_segment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An error in a trace, scenario or weights file names that file, not a segment."""
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"t": "x"}\n')
    assert main(["replay", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err == f'mpib-agent-py replay: bad_trace: {bad}:1: t: want seconds, got "x"\n', err
    for code in ("bad_trace", "bad_scenario"):
        assert str(mpib_agent.SegmentError(code, "f.json: conns: x")) == f"{code}: f.json: conns: x"
    assert str(mpib_agent.SegmentError("bad_weights", "x", "/w.json")) == "/w.json: bad_weights: x"
    assert str(mpib_agent.SegmentError("bad_magic", "x")) == "mpib shm (buffer): bad_magic: x"


def test_broken_pipe_is_quiet(tmp_path: Path) -> None:
    """``list | head -1``: the reader going away ends the command quietly with the status a
    shell shows for the Go CLI, which SIGPIPE ends (141), not an io error."""
    p = str(tmp_path / "hints")
    assert main(["create", "--path", p, "--slots", "4", "--peers", "2"]) == 0
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mpib_agent", "list", "--path", p],
            stdout=w,
            stderr=subprocess.PIPE,
            env=ENV,
            timeout=60,
        )
    finally:
        os.close(w)
    assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, b"")


def test_reclaim_due_by_time_not_ticks() -> None:
    """A policy loop runs its reclaim pass on its first tick and then whenever 5 s passed,
    whatever its interval (spec 5.7), as the Go agent's loop."""
    from mpib_agent._cli_agent import reclaim_due

    assert reclaim_due(None, 100.0)
    assert not reclaim_due(100.0, 101.0)  # a 1 s loop's next tick
    assert reclaim_due(100.0, 105.0)
    assert reclaim_due(100.0, 110.0)  # a 10 s loop's next tick
