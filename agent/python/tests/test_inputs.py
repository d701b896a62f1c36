"""Input the agent refuses with a clear error, or takes as the Go agent does: weights files,
sup_bw values from user code, scenario files, command lines. The rows both agents must
agree on are in TestCLIsAgree (agent/go/cmd/mpib-agent/clis_test.go) too."""

from __future__ import annotations

import pytest

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
    w = parse_weights(b'{"peers":{"10.0.2.7":1,"10.0.2.7/24":2,"10.0.2.0/24":3}}')
    assert w.peers == {"10.0.2.7": 1, "10.0.2.7/24": 2, "10.0.2.0/24": 3}


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
