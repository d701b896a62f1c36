"""mpib-agent-py: the Python agent's command line.

The segment commands (create, list, set, top, record, heartbeat, run, gc) take the same flags,
print the same output and exit as the Go ``mpib-agent`` (TestCLIsAgree in
agent/go/cmd/mpib-agent runs both on one segment): 0 done, 1 the operation failed (stderr:
"mpib-agent-py CMD: CODE: message", CODE shared with the Go agent), 2 the command line is
wrong. Python only: ``sim``, ``replay``, ``evaluate``, ``plot`` and ``record --raw``.

This module holds the command line's parser and ``main``; the commands are in
``_cli_segment`` (create, list, set, top, record, gc), ``_cli_agent`` (heartbeat, daemon, run)
and ``_cli_offline`` (sim, replay, evaluate, plot), and what they share in ``_cli_args``.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import warnings
from typing import Any, Dict, NoReturn, Optional, Sequence, Tuple

from . import __version__
from ._cli_agent import _cmd_heartbeat, _cmd_run
from ._cli_args import PROG, UsageError, _warn
from ._cli_offline import _cmd_evaluate, _cmd_plot, _cmd_replay, _cmd_sim
from ._cli_segment import _cmd_create, _cmd_gc, _cmd_list, _cmd_record, _cmd_set, _cmd_top
from ._segment import default_path
from ._types import SegmentError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: usage: {message}\n")


def _parser() -> Tuple[argparse.ArgumentParser, Dict[str, argparse.ArgumentParser]]:
    ap = _Parser(prog=PROG, description="MPIB hint segment agent (Python)", allow_abbrev=False)
    ap.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    subs: Dict[str, argparse.ArgumentParser] = {}

    def cmd(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        p.add_argument("--path", default=default_path(), help="segment file")
        subs[name] = p
        return p

    def dev_flag(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dev",
            action="append",
            metavar="N[,N...]",
            help="only the connections of these fused devices (the plugin's device index, "
            "0..65535): a comma list, or the flag repeated; default all",
        )

    p = cmd("create", "create the segment (mode 0600)")
    p.add_argument("--slots", default="1024")
    p.add_argument("--peers", default="256")
    p.add_argument("--force", action="store_true", help="replace a segment even while in use")
    p.set_defaults(fn=_cmd_create)
    p = cmd("list", "list connections and their hints")
    p.add_argument("--json", action="store_true")
    dev_flag(p)
    p.set_defaults(fn=_cmd_list)
    p = cmd("set", "set or clear a hint")
    p.add_argument("--conn", help="SLOT or PID:CONN_ID")
    p.add_argument("--gen", help="with --conn: the slot generation the hint is for (default: the one found now)")
    p.add_argument("--peer", help="IP or IP/LEN")
    p.add_argument("--class", dest="cls", help="intra or inter")
    p.add_argument("--sup-bw", help="parts per 1024 (0 all SOUT .. 1024 all SUP)")
    p.add_argument("--clear", action="store_true")
    p.set_defaults(fn=_cmd_set)
    p = cmd("top", "live per-rail throughput")
    p.add_argument("--interval", default="1")
    p.add_argument("--count", default="0")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON sample per line per interval")
    dev_flag(p)
    p.set_defaults(fn=_cmd_top)
    p = cmd("record", "write telemetry samples to a file")
    p.add_argument("--out", required=True, help="output file")
    p.add_argument("--format", default="jsonl", help="jsonl | csv")
    p.add_argument("--interval", default="1")
    p.add_argument("--count", default="0", help="samples (0: until stopped)")
    p.add_argument(
        "--raw",
        action="store_true",
        help="jsonl only (Python only): each connection also carries every telemetry counter (raw) and, "
        "when `sim` drives the segment, its ground truth (truth)",
    )
    dev_flag(p)
    p.set_defaults(fn=_cmd_record)
    p = cmd("sim", "simulated plugin with a rail model (for trying policies)")
    p.add_argument("--scenario", help="scenario name (--list shows them) or a scenario file, FILE.json")
    p.add_argument("--duration", help="simulated time (default: the scenario's; 0: until stopped)")
    p.add_argument("--speed", default="1", help="simulated seconds per real second")
    p.add_argument("--seed", help="noise seed")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.set_defaults(fn=_cmd_sim)
    for name in ("heartbeat", "daemon"):
        cmd(name, "beat until stopped").set_defaults(fn=_cmd_heartbeat)
    p = cmd("run", "policy loop with heartbeat")
    p.add_argument("--policy", default="static", help="static | proportional | closed-loop")
    p.add_argument("--file", help="static: weights JSON (re-read when it changes)")
    p.add_argument("--capacity", default="", help="proportional: sout=X,sup=Y")
    p.add_argument(
        "--step", help="closed-loop: largest move of the split per interval, parts per 1024 (1..256, default 64)"
    )
    p.add_argument("--interval", help="default 1 (closed-loop: 0.5)")
    p.set_defaults(fn=_cmd_run)
    cmd("gc", "reclaim slots of dead processes").set_defaults(fn=_cmd_gc)
    _offline_commands(sub, subs)
    return ap, subs


def _offline_commands(sub: Any, subs: Dict[str, argparse.ArgumentParser]) -> None:
    """replay, evaluate, plot: Python only, on the simulator's virtual clock or a file (no
    segment, hence no --path)."""
    p = sub.add_parser(
        "replay", help="drive the simulator from a capacity trace, print the percent of the optimum", allow_abbrev=False
    )
    p.add_argument("trace", help="trace file (JSON Lines; docs/agent.md, Traces)")
    p.add_argument("--policy", default="closed-loop", help="vanilla | proportional | closed-loop | module:function")
    p.add_argument("--seed", help="noise seed (default 1)")
    p.add_argument("--interval", default="0.5", help="policy interval, simulated (default 0.5)")
    p.add_argument("--record", metavar="FILE", help="also write the replayed run as a trace (for plot)")
    p.set_defaults(fn=_cmd_replay)
    subs["replay"] = p
    p = sub.add_parser(
        "evaluate", help="percent of the optimum per policy and scenario, over seeds", allow_abbrev=False
    )
    p.add_argument(
        "--policy",
        default="all",
        help="all | NAME[,NAME] | module:function (built-in: vanilla, proportional, closed-loop)",
    )
    p.add_argument("--scenarios", default="all", help="all | NAME[,NAME] | FILE.json (comma list)")
    p.add_argument("--seeds", default="5", help="seeds 1..N per scenario (default 5)")
    p.add_argument("--interval", default="0.5", help="policy interval, simulated (default 0.5)")
    p.add_argument("--jobs", help="processes (default: the CPU count)")
    p.set_defaults(fn=_cmd_evaluate)
    subs["evaluate"] = p
    p = sub.add_parser(
        "plot", help="draw rates, split and rail states of a trace (needs mpib-agent[plot])", allow_abbrev=False
    )
    p.add_argument("trace", help="trace file (record --raw, replay --record, or hand-written)")
    p.add_argument("-o", "--out", required=True, help="output PNG")
    p.set_defaults(fn=_cmd_plot)
    subs["plot"] = p


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap, subs = _parser()
    a, extra = ap.parse_known_args(argv)
    if extra:
        subs[a.cmd].error(f"unrecognized arguments: {' '.join(extra)}")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda m, *_a, **_k: _warn(m)
        try:
            rc: int = a.fn(a)
            return rc
        except UsageError as e:
            print(f"{PROG} {a.cmd}: usage: {e}", file=sys.stderr)
            return 2
        except SegmentError as e:
            msg = str(e)
            if msg.startswith(f"{e.code}: "):  # a file error without a path: its code once
                msg = msg[len(e.code) + 2 :]
            print(f"{PROG} {a.cmd}: {e.code}: {msg}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            return _broken_pipe()
        except (OSError, ValueError) as e:
            print(f"{PROG} {a.cmd}: io: {e}", file=sys.stderr)
            return 1


def _broken_pipe() -> int:
    """The reader of stdout went away (``list | head -1``): a quiet exit with the status a
    shell shows for the Go CLI, which SIGPIPE ends (128 + SIGPIPE). stdout is pointed at
    /dev/null so that the interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is no file descriptor (a test's capture): nothing to flush there
    return 128 + signal.SIGPIPE
