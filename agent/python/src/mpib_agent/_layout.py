"""The segment's byte layout (docs/shm-format.md, section 4): sizes, limits, field offsets
and the names the format gives to field values. Shared by the codec, the resolver and the
live segment; it holds no behaviour beyond offset arithmetic."""

from __future__ import annotations

import sys
from typing import Tuple

MAGIC = b"MPIBHINT"
VERSION = 6
HEADER_SIZE = 256
SLOT_SIZE = 384
PEER_SIZE = 64
REC_SIZE = 64
MAX_SLOTS = 65536
MAX_PEERS = 4096
SUP_BW_MAX = 1024
SEQ_ATTEMPTS = 8
FLAG_VALID = 1
DEFAULT_PATH_PREFIX = "/dev/shm/mpib-hints-"  # + the effective uid: one segment per user
DEFAULT_STALE_MS = 500
MAX_STALE_MS = 3600000
LOCK_ATTACH = 0  # lock bytes (spec 5.7): shared by attached plugins
LOCK_AGENT = 1  # exclusive: the one beating agent

STATE_FREE, STATE_CLAIMING, STATE_ACTIVE = 0, 1, 2
SOURCES = ("no_hint", "slot", "peer", "class", "stale", "inactive", "busy", "bad_slot")

# header
OFF_VERSION, OFF_HEADER_SIZE, OFF_TOTAL, OFF_NSLOTS = 8, 12, 16, 24
OFF_SLOT_SIZE, OFF_NPEERS, OFF_PEER_SIZE, OFF_FLAGS = 28, 32, 36, 40
OFF_HEARTBEAT, OFF_AGENT_PID, OFF_PEERS_EPOCH, OFF_CREATED = 64, 72, 76, 80
OFF_CLASS = 128
# hint record (relative)
R_SEQ, R_SUP_BW, R_FLAGS, R_GEN, R_SET_NS, R_PEER_IP, R_PREFIX = 0, 4, 8, 12, 16, 24, 28
# slot (relative)
S_OWNER, S_GEN, S_CONN, S_LOCAL, S_PEER, S_ISLAND = 0, 8, 16, 24, 28, 32
S_CLASS, S_SEND, S_QSOUT, S_QSUP, S_PID, S_REG, S_HINT = 36, 37, 38, 40, 44, 48, 64
# the connection's fused device (u16), its NICs' ports (u8 each) and names
S_DEV, S_SOUT_PORT, S_SUP_PORT = 42, 56, 57
S_SUP_PATH = 58  # how SUP reaches the peer (SUP_PATHS)
S_SOUT_NIC, S_SUP_NIC = 336, 360  # char[NIC_NAME] each, NUL-padded, NUL-terminated
NIC_NAME = 24
TELEMETRY: Tuple[Tuple[str, int, int], ...] = (
    ("sout_bytes", 128, 8),
    ("sout_requests", 136, 8),
    ("sup_bytes", 144, 8),
    ("sup_requests", 152, 8),
    ("reads_applied", 160, 8),
    ("reads_fallback", 168, 8),
    ("reads_stale", 176, 8),
    ("clamped", 184, 8),
    ("last_sup_bw", 192, 4),
    ("last_source", 196, 4),
    ("last_read_ns", 200, 8),
    ("failovers", 212, 4),
    ("sout_state_ns", 216, 8),
    ("sup_state_ns", 224, 8),
    # the split applied, the last flush (CLOCK_REALTIME), per rail what completed
    ("applied_sup_bw", 232, 4),
    ("recoveries", 236, 4),  # times a rail came back into service
    ("flush_wall_ns", 240, 8),
    ("sout_completed_bytes", 256, 8),
    ("sout_completed_requests", 264, 8),
    ("sout_inflight_bytes", 272, 8),  # a gauge
    ("sout_busy_ns", 280, 8),
    ("sup_completed_bytes", 288, 8),
    ("sup_completed_requests", 296, 8),
    ("sup_inflight_bytes", 304, 8),
    ("sup_busy_ns", 312, 8),
    ("sout_active_ns", 320, 8),  # time with a request in flight on the rail
    ("sup_active_ns", 328, 8),
)
S_TELEMETRY = 128  # telemetry spans [S_TELEMETRY, S_TELEMETRY_END): zeroed at each claim
S_TELEMETRY_END = S_SOUT_NIC  # the NIC names after it are descriptor fields
# rail states (u8 each): field name, offset; JSON and the dataclass hold rail_state_name()
RAIL_STATE_FIELDS: Tuple[Tuple[str, int], ...] = (("sout_state", 208), ("sup_state", 209))
RAIL_STATES = ("up", "down", "failed")  # 0 in service, 1 out after a failover, 2 device gone

if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("mpib_agent: the hint segment is little-endian and accessed in place")

REC_FMT = "<IIIIQIB"  # seq, sup_bw, flags, gen, set_ns, peer_ip, prefix_len (29 bytes)
REC_FIELDS_FMT = "<IIIQIB"  # the same without seq, from offset +4 (25 bytes)
SUP_PATHS = {0: "none", 1: "direct", 2: "routed", 3: "island"}


def total_size(nslots: int, npeers: int) -> int:
    return HEADER_SIZE + nslots * SLOT_SIZE + npeers * PEER_SIZE


def slot_off(i: int) -> int:
    return HEADER_SIZE + i * SLOT_SIZE


def peer_off(nslots: int, j: int) -> int:
    return HEADER_SIZE + nslots * SLOT_SIZE + j * PEER_SIZE


def class_off(c: int) -> int:
    return OFF_CLASS + c * REC_SIZE
