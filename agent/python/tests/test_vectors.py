"""The shared vectors (testdata/shm): same decoding, errors, bytes and resolutions as Go and C."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest

import mpib_agent
from conftest import VECTORS

CASES = sorted(VECTORS.glob("*.json"))


def test_vectors_present() -> None:
    assert len(CASES) >= 10, f"no vectors in {VECTORS}"


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_vector(path: Path) -> None:
    want: Dict[str, Any] = json.loads(path.read_text())
    data = path.with_suffix(".bin").read_bytes()
    assert len(data) == want["file_size"]
    if want["error"]:
        with pytest.raises(mpib_agent.SegmentError) as ei:
            mpib_agent.decode(data)
        assert ei.value.code == want["error"]
        return
    snap = mpib_agent.decode(data)
    assert snap.to_dict() == want["segment"]
    assert mpib_agent.encode(snap) == data
    assert mpib_agent.encode(mpib_agent.Snapshot.from_dict(want["segment"])) == data
    for r in want["reads"]:
        got = mpib_agent.resolve(data, r["slot"], r["now_ns"], r["stale_ns"])
        assert (got.applies, got.sup_bw, got.source, got.clamped) == (
            r["applies"],
            r["sup_bw"],
            r["source"],
            r["clamped"],
        ), r


@pytest.mark.parametrize("path", [p for p in CASES if not json.loads(p.read_text())["error"]], ids=lambda p: p.stem)
def test_vector_opens_as_file(path: Path, tmp_path: Path) -> None:
    f = tmp_path / "seg"
    f.write_bytes(path.with_suffix(".bin").read_bytes())
    f.chmod(0o600)
    with mpib_agent.open_segment(str(f)) as seg:
        want = json.loads(path.read_text())
        assert seg.nslots == want["segment"]["header"]["nslots"]
        for r in want["reads"]:
            got = seg.resolve(r["slot"], r["now_ns"], r["stale_ns"])
            assert (got.applies, got.sup_bw, got.source) == (r["applies"], r["sup_bw"], r["source"])
