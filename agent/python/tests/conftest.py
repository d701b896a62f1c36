from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

import mpib_agent
from mpib_agent._format import STATE_ACTIVE, Slot, encode_slot

VECTORS = Path(__file__).resolve().parents[3] / "testdata" / "shm"


@pytest.fixture
def seg(tmp_path: Path) -> Iterator[mpib_agent.Segment]:
    s = mpib_agent.create(str(tmp_path / "hints"), nslots=8, npeers=4)
    yield s
    s.close()


def fake_register(seg: mpib_agent.Segment, index: int, peer: str, path_class: int, gen: int = 1,
                  pid: int = 0) -> Slot:
    """Writes an ACTIVE slot the way a plugin would (tests only)."""
    s = Slot(index=index, state=STATE_ACTIVE, owner_pid=pid or os.getpid(), gen=gen, conn_id=index,
             local_sout_ip="10.0.1.1", peer_sout_ip=peer, path_class=path_class, is_send=1,
             nqps_sout=2, nqps_sup=4, pid=pid or os.getpid())
    encode_slot(seg._v, s)
    return s
