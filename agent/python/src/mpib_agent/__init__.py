"""Agent side of MPIB's shared-memory hint segment (docs/shm-format.md, version 6)."""

from ._closedloop import ClosedLoopPolicy
from ._codec import decode, encode
from ._layout import DEFAULT_PATH_PREFIX, SUP_BW_MAX, VERSION
from ._policy import (
    ConnRate,
    Proportional,
    SlotSkippedWarning,
    StaticWeights,
    agent_loop,
    parse_weights,
    rates,
    run_policy,
)
from ._resolve import resolve
from ._segment import (
    Liveness,
    Segment,
    beat_period_s,
    create,
    default_path,
    liveness,
    now_ns,
    open_segment,
    stale_ns_from_env,
)
from ._types import (
    GenerationChanged,
    Header,
    HintClampedWarning,
    Peer,
    Record,
    Resolution,
    SegmentError,
    Slot,
    Snapshot,
    Telemetry,
)
from ._watch import watch

# The package's version (PEP 440), which flit gives the wheel and sdist. In the tree it is a
# development version; the release build (internal/dist) rewrites this line in the copy it
# builds from, to the release's version.
__version__ = "0.0.0.dev0"

__all__ = (
    "__version__",
    "DEFAULT_PATH_PREFIX",
    "SUP_BW_MAX",
    "VERSION",
    "ClosedLoopPolicy",
    "ConnRate",
    "GenerationChanged",
    "Header",
    "HintClampedWarning",
    "Liveness",
    "Peer",
    "Proportional",
    "Record",
    "Resolution",
    "Segment",
    "SegmentError",
    "Slot",
    "SlotSkippedWarning",
    "Snapshot",
    "StaticWeights",
    "Telemetry",
    "agent_loop",
    "beat_period_s",
    "create",
    "decode",
    "default_path",
    "encode",
    "liveness",
    "now_ns",
    "open_segment",
    "parse_weights",
    "rates",
    "resolve",
    "run_policy",
    "stale_ns_from_env",
    "watch",
)
