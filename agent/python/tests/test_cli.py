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
from mpib_agent._cli import main
from conftest import fake_register


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = str(tmp_path / "hints")
    assert main(["create", "--path", p, "--slots", "4", "--peers", "2"]) == 0
    assert main(["create", "--path", p]) == 1
    with mpib_agent.open_segment(p) as seg:
        fake_register(seg, 1, "10.0.2.7", 1)
        seg.beat()
        assert main(["set", "--path", p, "--conn", "1", "--sup-bw", "512"]) == 0
        assert seg.resolve(1).sup_bw == 512
        assert main(["set", "--path", p, "--conn", f"{os.getpid()}:1", "--clear"]) == 0
        assert main(["set", "--path", p, "--class", "inter", "--sup-bw", "5000"]) == 0
        assert seg.resolve(1) == mpib_agent.Resolution(True, 1024, "class")
        err = capsys.readouterr().err
        assert "clamped to 1024" in err
        assert main(["set", "--path", p, "--conn", "3", "--sup-bw", "1"]) == 1
        assert main(["set", "--path", p, "--sup-bw", "1"]) == 1
        assert main(["list", "--path", p, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out[0]["effective"]["source"] == "class"
        assert main(["list", "--path", p]) == 0
        assert "10.0.2.7" in capsys.readouterr().out
        assert main(["top", "--path", p, "--count", "1", "--interval", "0.05", "--plain"]) == 0
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
    env = dict(os.environ, PYTHONPATH=str(Path(mpib_agent.__file__).parents[1]))
    with mpib_agent.open_segment(p) as seg:
        for sig in (signal.SIGKILL, signal.SIGTERM):
            proc = subprocess.Popen([sys.executable, "-m", "mpib_agent", "heartbeat", "--path", p], env=env,
                                    stdout=subprocess.DEVNULL)
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
