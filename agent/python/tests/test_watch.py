"""watch(), top --json and record."""

from __future__ import annotations

import csv
import io
import json
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

import mpib_agent
from mpib_agent import sim
from mpib_agent._cli import main
from mpib_agent._watch import CONN_FIELDS

FIELDS = {
    "slot",
    "gen",
    "pid",
    "conn_id",
    "is_send",
    "path_class",
    "sout_mbps",
    "sup_mbps",
    "last_sup_bw",
    "sout_state",
    "sup_state",
    "sout_completed_mbps",
    "sup_completed_mbps",
    "sout_latency_us",
    "sup_latency_us",
    "sout_inflight_bytes",
    "sup_inflight_bytes",
    "applied_sup_bw",
    "flush_wall_ns",
    "dev",
    "sout_nic",
    "sup_nic",
}


@pytest.fixture
def running(tmp_path: Path) -> Any:
    """The real-time simulator (scenario 2to1) on a segment, an agent setting sup_bw 256."""
    p = str(tmp_path / "hints")
    stop = threading.Event()
    sm = sim.Simulator("2to1", p, seed=1, nslots=16, npeers=0)
    t = threading.Thread(target=sm.run, kwargs={"duration": 0, "stop": stop, "note": lambda s: None})
    t.start()
    seg = mpib_agent.open_segment(p)
    seg.set_class_hint("intra", 256)
    beating = threading.Event()

    def beat() -> None:
        while not beating.wait(0.05):
            seg.beat()

    b = threading.Thread(target=beat)
    b.start()
    yield p
    beating.set()
    b.join()
    stop.set()
    t.join()
    sm.close()
    seg.close()


def _check(s: Dict[str, Any]) -> List[Dict[str, Any]]:
    assert set(s) == {"t", "conns"} and isinstance(s["t"], float) and s["t"] > 1.7e9
    for c in s["conns"]:
        assert set(c) == FIELDS
    return list(s["conns"])


def test_watch(running: str) -> None:
    assert set(CONN_FIELDS) == FIELDS
    samples = list(mpib_agent.watch(running, 0.1, count=3))
    assert len(samples) == 3
    conns = _check(samples[-1])
    assert len(conns) == 3
    send = [c for c in conns if c["is_send"] == 1 and c["conn_id"] == 0][0]
    assert send["last_sup_bw"] == 256 and send["sout_state"] == "up" and send["pid"] == 4242
    assert send["sout_mbps"] > 0 and send["sup_mbps"] > 0
    with pytest.raises(ValueError):
        next(mpib_agent.watch(running, 0))


def test_top_json(running: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", "--path", running, "--json", "--count", "2", "--interval", "100ms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line in lines:
        _check(json.loads(line))
    assert len(json.loads(lines[1])["conns"]) == 3


def test_record(running: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.jsonl"
    assert main(["record", "--path", running, "--out", str(out), "--count", "3", "--interval", "0.1"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and len(_check(json.loads(lines[2]))) == 3
    out = tmp_path / "s.csv"
    assert (
        main(["record", "--path", running, "--out", str(out), "--format", "csv", "--count", "2", "--interval", "0.1"])
        == 0
    )
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert out.read_text().splitlines()[0] == "t," + ",".join(CONN_FIELDS)
    assert len(rows) >= 3 and {r["sout_state"] for r in rows} == {"up"}
    for args, msg in (
        (["--format", "xml"], "--format 'xml'"),
        (["--count", "-1"], "--count -1"),
        (["--interval", "0"], "--interval '0'"),
    ):
        assert main(["record", "--path", running, "--out", str(tmp_path / "x")] + args) == 2
        assert msg in capsys.readouterr().err
    assert main(["record", "--path", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]) == 1
    assert not (tmp_path / "y").exists()
