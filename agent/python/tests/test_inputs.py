"""Input the agent refuses with a clear error, or takes as the Go agent does: weights files,
sup_bw values from user code, scenario files, command lines. The rows both agents must
agree on are in TestCLIsAgree (agent/go/cmd/mpib-agent/clis_test.go) too."""

from __future__ import annotations

import numbers
import threading
from pathlib import Path
from typing import Callable

import pytest

import mpib_agent
from mpib_agent import sim
from mpib_agent._cli import main
from mpib_agent._policy import parse_weights
from mpib_agent._types import SegmentError


@pytest.mark.parametrize(
    "body, want",
    [
        ('{"class":{"intra":1,"intra":2}}', 'duplicate key "intra"'),
        ('{"class":{"intra":1},"class":{"inter":2}}', 'duplicate key "class"'),
        ('{"class":{},"class":{"0":1,"0":2}}', 'duplicate key "0"'),
        ('{"class":{"0":700,"intra":5}}', 'class "0" and "intra" name the same target: keep one'),
        ('{"class":{"Inter":7,"inter":5}}', 'class "Inter" and "inter" name the same target: keep one'),
        (
            '{"peers":{"10.0.2.7":900,"10.0.2.7/32":100}}',
            'peers "10.0.2.7" and "10.0.2.7/32" name the same target: keep one',
        ),
        (
            '{"peers":{"10.0.2.0/08":1,"10.0.2.0/8":2}}',
            'peers "10.0.2.0/08" and "10.0.2.0/8" name the same target: keep one',
        ),
        (
            '{"peers":{"10.0.2.0/24":1,"10.0.2.7/24":2}}',
            'peers "10.0.2.0/24" and "10.0.2.7/24" name the same target: keep one',
        ),
        ('{"conns":{"03":1,"3":2}}', 'conns "03" and "3" name the same target: keep one'),
    ],
)
def test_weights_duplicates(body: str, want: str) -> None:
    """A file that says two things of one target is refused, naming both keys (the same
    messages as the Go agent's TestParseWeightsDuplicates)."""
    with pytest.raises(SegmentError) as e:
        parse_weights(body.encode())
    assert (e.value.code, e.value.detail) == ("bad_weights", want)


def test_weights_distinct_peers() -> None:
    w = parse_weights(b'{"peers":{"10.0.2.7":1,"10.0.2.7/24":2,"10.0.2.0/16":3}}')
    assert w.peers == {"10.0.2.7": 1, "10.0.2.7/24": 2, "10.0.2.0/16": 3}


@pytest.mark.parametrize("literal", ["-0", "-1", "-0.0", "NaN", "Infinity", "-Infinity", "1e3", "512.0"])
def test_weights_literals_refused(literal: str) -> None:
    """Only an unsigned integer literal is a weight, as the Go agent reads it (-0 included)."""
    with pytest.raises(SegmentError) as e:
        parse_weights(f'{{"class":{{"intra":{literal}}}}}'.encode())
    assert e.value.code == "bad_weights"


def test_weights_huge_literal() -> None:
    """A literal beyond int()'s digit limit is taken, and clamps, as the Go agent's."""
    w = parse_weights(b'{"class":{"intra":' + b"9" * 5000 + b"}}")
    assert w.cls == {"intra": 0xFFFFFFFF}


class _Index:
    """An integer of user code that is not an int (as numpy's are): numbers.Integral by
    registration, an int through __index__."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __repr__(self) -> str:
        return f"_Index({self.v})"


numbers.Integral.register(_Index)


def _integers_taken(tmp_path: Path, make: Callable[[int], object]) -> None:
    """sup_bw and slot values of the kind ``make`` gives are taken by set_*_hint, run_policy's
    and drive's callbacks, and ClosedLoopPolicy's step."""
    p = str(tmp_path / "hints")
    with sim.Simulator("equal", p, seed=1, nslots=8, npeers=2) as sm, mpib_agent.open_segment(p) as seg:
        c = sm.conns[0]
        assert seg.set_class_hint("inter", make(5)) == 5
        assert seg.set_peer_hint("10.0.2.0/24", make(6)) == 6
        assert seg.set_slot_hint(make(c.slot), make(7), gen=c.gen) == 7
        with pytest.warns(mpib_agent.HintClampedWarning):
            assert seg.set_class_hint("intra", make(5000)) == 1024
    p = str(tmp_path / "driven")
    with sim.Simulator("equal", p, seed=1, nslots=8, npeers=0) as sm:
        c = sm.conns[0]
        sim.drive(sm, lambda rates: {make(r.slot.index): make(300) for r in rates}, 0.1, 0.3)
        with mpib_agent.open_segment(p) as seg:
            assert seg.slot(c.slot).hint.sup_bw == 300
            stop = threading.Event()
            mpib_agent.run_policy(seg, lambda rates: (stop.set(), {make(c.slot): make(301)})[1], 0.01, stop=stop)
            assert seg.slot(c.slot).hint.sup_bw == 301
    assert mpib_agent.ClosedLoopPolicy(make(8)).step == 8


def test_integral_values_stdlib(tmp_path: Path) -> None:
    _integers_taken(tmp_path, _Index)


def test_numpy_integer_values(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy", reason="numpy is an optional extra: the stdlib test covers numbers.Integral")
    _integers_taken(tmp_path, np.int64)
    with mpib_agent.create(str(tmp_path / "h2"), nslots=2, npeers=1) as seg:
        for bad in (np.float64(5.0), np.bool_(True), True, -1, np.int64(-1)):
            with pytest.raises(SegmentError, match="sup_bw .*: want an integer 0..1024"):
                seg.set_class_hint("inter", bad)


def test_policy_slot_not_integer(tmp_path: Path) -> None:
    """A policy's slot key that is no integer is an error naming it, not a silent skip."""
    p = str(tmp_path / "hints")
    with sim.Simulator("equal", p, seed=1, nslots=8, npeers=0) as sm:
        with pytest.raises(SegmentError, match=r"bad_value: policy returned slot '[0-9]+': want an integer slot index"):
            sim.drive(sm, lambda rates: {str(r.slot.index): 300 for r in rates}, 0.1, 0.3)


@pytest.mark.parametrize(
    "capacity, msg",
    [
        ("sout=100", 'rail "sup" missing: give both'),
        ("sup=100", 'rail "sout" missing: give both'),
        ("sout=1" + "0" * 400 + ",sup=1", "want sout=X,sup=Y with numbers >= 0"),
    ],
)
def test_capacity_needs_both_rails(tmp_path: Path, capsys: pytest.CaptureFixture[str], capacity: str, msg: str) -> None:
    """One rail's capacity alone would give the other 0 (all traffic on one rail): a usage
    error naming the missing rail, as the Go CLI's."""
    p = str(tmp_path / "hints")
    mpib_agent.create(p, nslots=2, npeers=1).close()
    assert main(["run", "--policy", "proportional", "--capacity", capacity, "--path", p]) == 2
    err = capsys.readouterr().err
    assert "mpib-agent-py run: usage:" in err and msg in err, err
