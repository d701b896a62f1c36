"""The device fields (spec 4.3): dev (u16 at +42), the NICs' ports (u8 at +56,
+57) and names (char[24] at +336, +360), their decoding, encoding and registration, and the
CLI's DEV column and --dev filter."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Iterator, List

import pytest

import mpib_agent
from mpib_agent._cli import main
from mpib_agent._layout import NIC_NAME, slot_off
from mpib_agent._plugin import ConnDesc, PluginProcess
from mpib_agent._types import nic_name, nic_name_bytes
from mpib_agent._watch import CONN_FIELDS

NUL = b"\0"


def test_nic_name() -> None:
    """The bytes before the first NUL (all 24 without one), each byte outside 0x21..0x7e as '?'."""
    assert nic_name(b"mlx5_0".ljust(NIC_NAME, NUL)) == "mlx5_0"
    assert nic_name(bytes(NIC_NAME)) == ""
    n23 = b"rocep65s0f0_long_name_x"
    assert len(n23) == 23
    assert nic_name(n23 + NUL) == n23.decode()
    assert nic_name(b"abcdefghijklmnopqrstuvwx") == "abcdefghijklmnopqrstuvwx"  # 24 bytes, no NUL
    assert nic_name(b"mlx5_1\0garbage\xff\n".ljust(NIC_NAME, NUL)) == "mlx5_1"  # after the NUL: ignored
    assert nic_name(b"a b\tc\x01d\x7fe\x80f\xffg~!".ljust(NIC_NAME, NUL)) == "a?b?c?d?e?f?g~!"
    assert nic_name("né0".encode().ljust(NIC_NAME, NUL)) == "n??0"  # UTF-8: one '?' per byte
    assert nic_name(bytes(range(0x20, 0x38))) == "?" + "".join(chr(c) for c in range(0x21, 0x38))


def test_nic_name_bytes() -> None:
    """The writer's rule: ASCII, cut to 23 bytes, NUL-padded to 24, so a NUL always ends it."""
    assert nic_name_bytes("mlx5_0") == b"mlx5_0" + bytes(18)
    assert nic_name_bytes("") == bytes(NIC_NAME)
    assert nic_name_bytes("x" * 23) == b"x" * 23 + NUL
    assert nic_name_bytes("abcdefghijklmnopqrstuvwxyz") == b"abcdefghijklmnopqrstuvw" + NUL
    assert nic_name_bytes("né") == b"n?" + bytes(22)
    for name in ("", "mlx5_0", "x" * 23, "y" * 40):
        assert len(nic_name_bytes(name)) == NIC_NAME and nic_name(nic_name_bytes(name)) == name[:23]


def _snap(*slots: mpib_agent.Slot) -> mpib_agent.Snapshot:
    return mpib_agent.Snapshot(
        header=mpib_agent.Header(total_size=256 + 4 * 384, nslots=4, npeers=0), slots=list(slots)
    )


def test_device_fields_round_trip() -> None:
    """encode writes the fields at the spec's offsets, decode reads them back, the dict form
    (list --json, the vectors) has them right after registered_ns."""
    s1 = mpib_agent.Slot(
        index=1,
        state=2,
        gen=3,
        conn_id=7,
        dev=1,
        sout_port=1,
        sup_port=2,
        sout_nic="mlx5_1",
        sup_nic="mlx5_8",
        registered_ns=5,
    )
    s3 = mpib_agent.Slot(
        index=3, gen=1, dev=15, sout_port=255, sup_port=1, sout_nic="rocep65s0f0_long_name_x", sup_nic="ibp12s0"
    )  # a free slot keeps its names
    img = mpib_agent.encode(_snap(s1, s3))
    o1, o3 = slot_off(1), slot_off(3)
    assert img[o1 + 42 : o1 + 44] == (1).to_bytes(2, "little") and img[o1 + 56 : o1 + 58] == bytes([1, 2])
    assert img[o1 + 336 : o1 + 360] == b"mlx5_1" + bytes(18)
    assert img[o1 + 360 : o1 + 384] == b"mlx5_8" + bytes(18)
    assert img[o3 + 42 : o3 + 44] == (15).to_bytes(2, "little") and img[o3 + 56 : o3 + 58] == bytes([255, 1])
    assert img[o3 + 336 : o3 + 360] == b"rocep65s0f0_long_name_x" + NUL
    assert img[o1 + 44 : o1 + 48] == bytes(4) and img[o1 + 58 : o1 + 64] == bytes(6)  # pid 0, sup_path 0, reserved
    snap = mpib_agent.decode(img)
    assert snap.slots == [s1, s3]
    d = snap.to_dict()
    keys = list(d["slots"][0])
    i = keys.index("registered_ns")
    assert keys[i + 1 : i + 8] == ["dev", "sout_port", "sup_port", "sup_path", "sout_nic", "sup_nic", "hint"]
    assert {k: d["slots"][1][k] for k in keys[i + 1 : i + 7]} == {
        "dev": 15,
        "sout_port": 255,
        "sup_port": 1,
        "sup_path": 0,
        "sout_nic": "rocep65s0f0_long_name_x",
        "sup_nic": "ibp12s0",
    }
    assert mpib_agent.encode(mpib_agent.Snapshot.from_dict(json.loads(json.dumps(d)))) == img


def test_device_fields_garbage() -> None:
    """Raw names the writer would never store: 24 bytes without NUL, control and non-ASCII
    bytes. Readers show them safely; re-encoding writes what they show, cut to 23 bytes."""
    img = bytearray(mpib_agent.encode(_snap(mpib_agent.Slot(index=2, state=2, gen=1))))
    off = slot_off(2)
    img[off + 42 : off + 44] = (0xFFFF).to_bytes(2, "little")
    img[off + 336 : off + 360] = b"abcdefghijklmnopqrstuvwx"
    img[off + 360 : off + 384] = b'\n"}\xff ok\0hidden'.ljust(24, b"Z")
    s = mpib_agent.decode(bytes(img)).slots[0]
    assert (s.dev, s.sout_nic, s.sup_nic) == (0xFFFF, "abcdefghijklmnopqrstuvwx", '?"}??ok')
    again = mpib_agent.decode(mpib_agent.encode(_snap(s))).slots[0]
    assert (again.sout_nic, again.sup_nic) == ("abcdefghijklmnopqrstuvw", '?"}??ok')


def test_plugin_registers_device(tmp_path: Path) -> None:
    """The stand-in plugin stores the descriptor's device fields at registration (the
    telemetry it zeroes stops before the names); defaults dev 0, ports 1, no names."""
    p = str(tmp_path / "hints")
    mpib_agent.create(p, 4, 0).close()
    with mpib_agent.open_segment(p) as agent, PluginProcess(p, pid=77) as plug:
        i = plug.register(
            ConnDesc(
                conn_id=1,
                dev=3,
                sout_port=1,
                sup_port=2,
                sout_nic="mlx5_3",
                sup_nic="a_very_long_nic_name_over_23_bytes",
            )
        )
        s = agent.slot(i)
        assert (s.dev, s.sout_port, s.sup_port, s.sout_nic, s.sup_nic) == (3, 1, 2, "mlx5_3", "a_very_long_nic_name_ov")
        plug.put_counters(i, {"sup_active_ns": 9})
        plug.release(i)
        j = plug.register(ConnDesc(conn_id=1))
        assert j == i
        s = agent.slot(j)
        assert (s.gen, s.dev, s.sout_port, s.sup_port, s.sout_nic, s.sup_nic) == (2, 0, 1, 1, "", "")
        assert s.telemetry == mpib_agent.Telemetry()


def _two_devices(tmp_path: Path) -> str:
    """A segment where a plugin registered connections of devices 0 (slots of conn 1, 2) and 1
    (conn 3), each with its NICs; the plugin process stays attached until the test ends."""
    p = str(tmp_path / "hints")
    assert main(["create", "--path", p, "--slots", "8", "--peers", "2"]) == 0
    plug = PluginProcess(p, pid=4242)
    for conn, dev in ((1, 0), (2, 0), (3, 1)):
        plug.register(
            ConnDesc(
                conn_id=conn,
                peer_sout_ip=f"10.0.2.{conn}",
                dev=dev,
                sout_nic=f"mlx5_{dev}",
                sup_nic=f"mlx5_{dev + 8}",
                sup_port=dev + 1,
            )
        )
    _PLUGS.append(plug)
    return p


_PLUGS: List[PluginProcess] = []


@pytest.fixture(autouse=True)
def _close_plugs() -> Iterator[None]:
    yield
    while _PLUGS:
        _PLUGS.pop().close()


def test_cli_list_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _two_devices(tmp_path)
    capsys.readouterr()
    assert main(["list", "--path", p, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(
        (c["conn_id"], c["dev"], c["sout_nic"], c["sup_nic"], c["sout_port"], c["sup_port"]) for c in out
    ) == [(1, 0, "mlx5_0", "mlx5_8", 1, 1), (2, 0, "mlx5_0", "mlx5_8", 1, 1), (3, 1, "mlx5_1", "mlx5_9", 1, 2)]
    assert main(["list", "--path", p, "--json", "--dev", "1"]) == 0
    assert [c["conn_id"] for c in json.loads(capsys.readouterr().out)] == [3]
    assert main(["list", "--path", p, "--json", "--dev", "0"]) == 0
    assert sorted(c["conn_id"] for c in json.loads(capsys.readouterr().out)) == [1, 2]
    for args in (["--dev", "0,1"], ["--dev", "1", "--dev", "0"], ["--dev=1,0,1"]):
        assert main(["list", "--path", p, "--json", *args]) == 0
        assert sorted(c["conn_id"] for c in json.loads(capsys.readouterr().out)) == [1, 2, 3], args
    assert main(["list", "--path", p, "--json", "--dev", "2"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["list", "--path", p, "--dev", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["SLOT", "DEV", "PID:CONN"]
    assert len(lines) == 4 and lines[2].split()[1:3] == ["1", "4242:3"] and lines[3] == "defaults: none"


def test_cli_top_record_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _two_devices(tmp_path)
    capsys.readouterr()
    assert main(["top", "--path", p, "--json", "--count", "1", "--interval", "20ms", "--dev", "1"]) == 0
    smp = json.loads(capsys.readouterr().out)
    assert [(c["conn_id"], c["dev"], c["sout_nic"], c["sup_nic"]) for c in smp["conns"]] == [(3, 1, "mlx5_1", "mlx5_9")]
    assert list(smp["conns"][0])[-3:] == ["dev", "sout_nic", "sup_nic"]
    assert main(["top", "--path", p, "--plain", "--count", "1", "--interval", "20ms", "--dev", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:3] == ["SLOT", "DEV", "PEER"]
    assert sorted(ln.split()[2] for ln in lines[2:4]) == ["10.0.2.1", "10.0.2.2"] and lines[4].split()[0] == "total"
    assert all(ln.split()[1] == "0" for ln in lines[2:4]) and len(lines) == 5
    assert main(["top", "--path", p, "--plain", "--count", "1", "--interval", "20ms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[:2] for ln in lines if ln.startswith("  dev")] == [["dev", "0"], ["dev", "1"]]
    assert lines[-1].split()[0] == "total"
    out = tmp_path / "r.csv"
    assert (
        main(
            [
                "record",
                "--path",
                p,
                "--out",
                str(out),
                "--format",
                "csv",
                "--count",
                "1",
                "--interval",
                "20ms",
                "--dev",
                "0",
            ]
        )
        == 0
    )
    rows = list(csv.reader(out.open()))
    assert rows[0][-3:] == ["dev", "sout_nic", "sup_nic"] and rows[0][:3] == ["t", "slot", "gen"]
    assert tuple(rows[0][1:]) == CONN_FIELDS
    assert len(rows) == 3 and all(r[-3:] == ["0", "mlx5_0", "mlx5_8"] for r in rows[1:])
    out = tmp_path / "r.jsonl"
    assert main(["record", "--path", p, "--out", str(out), "--count", "2", "--interval", "20ms", "--dev", "1"]) == 0
    for line in out.read_text().splitlines():
        assert [(c["conn_id"], c["dev"]) for c in json.loads(line)["conns"]] == [(3, 1)]


@pytest.mark.parametrize("bad", ["-1", "x", "65536", "", "1,,2", "0,", "+1", "1.5", "0x1", "١", " 1"])
def test_cli_bad_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    p = _two_devices(tmp_path)
    capsys.readouterr()
    out = tmp_path / "r.csv"
    for args in (["list"], ["list", "--json"], ["top", "--count", "1"], ["record", "--out", str(out), "--count", "1"]):
        assert main([*args, "--path", p, "--dev", bad]) == 2, args
        err = capsys.readouterr().err
        assert f"{args[0]}: usage: --dev {bad!r}: want device indexes 0..65535" in err, err
    assert not out.exists()
    assert main(["list", "--path", p, "--dev", "65535"]) == 0  # the largest u16: valid, no connection
    with pytest.raises(SystemExit) as ei:  # no value: argparse's usage error
        main(["list", "--path", p, "--dev"])
    assert ei.value.code == 2


def test_sup_path_field() -> None:
    """The sup_path field (+58): written at its offset, read back, named for people; a value
    the spec does not define is kept and shown as unknown(N)."""
    from mpib_agent._types import sup_path_name

    s0 = mpib_agent.Slot(index=0, state=2, gen=1, conn_id=1, sup_path=2, sup_nic="b1_sup_b2")
    s2 = mpib_agent.Slot(index=2, gen=4, sup_path=9)
    img = mpib_agent.encode(_snap(s0, s2))
    assert img[slot_off(0) + 58] == 2 and img[slot_off(2) + 58] == 9
    assert img[slot_off(0) + 59 : slot_off(0) + 64] == bytes(5)
    assert mpib_agent.decode(img).slots == [s0, s2]
    assert [sup_path_name(p) for p in (0, 1, 2, 3, 9)] == ["none", "direct", "routed", "island", "unknown(9)"]
