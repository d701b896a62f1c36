"""Agent side of MPIB's shared-memory hint segment (docs/shm-format.md, version 1)."""

from ._format import (
    DEFAULT_PATH,
    SUP_BW_MAX,
    VERSION,
    Header,
    HintClampedWarning,
    Peer,
    Record,
    Resolution,
    SegmentError,
    Slot,
    Snapshot,
    Telemetry,
    decode,
    encode,
    resolve,
)
from ._policy import ConnRate, Proportional, rates, run_policy
from ._segment import Segment, create, now_ns, open_segment

__all__ = (
    "DEFAULT_PATH",
    "SUP_BW_MAX",
    "VERSION",
    "ConnRate",
    "Header",
    "HintClampedWarning",
    "Peer",
    "Proportional",
    "Record",
    "Resolution",
    "Segment",
    "SegmentError",
    "Slot",
    "Snapshot",
    "Telemetry",
    "create",
    "decode",
    "encode",
    "now_ns",
    "open_segment",
    "rates",
    "resolve",
    "run_policy",
)
