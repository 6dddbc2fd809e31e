"""Outputs never damage what they replace (issue 27, item 2): a regular file is replaced whole
(its mode kept), a symlink written through, a device or FIFO written into (its node kept), a
socket refused; one line and exit 2 for what cannot be written."""
import os
import socket
import stat
import threading

import pytest

from core.__main__ import main
from tests.conftest import DATA

WORKLOAD = str(DATA / "workloads" / "burst5.json")
TRACE = str(DATA / "traces" / "chapter31_continuous.json")


def cli(capsys, *args):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_regular_file_keeps_its_mode(tmp_path, capsys):
    out = tmp_path / "t.json"
    out.write_text("old")
    os.chmod(out, 0o600)
    assert cli(capsys, "simulate", WORKLOAD, "--out", out)[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and out.read_text().startswith("{")


def test_a_symlink_is_written_through(tmp_path, capsys):
    target = tmp_path / "real.csv"
    target.write_text("old")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert cli(capsys, "export", TRACE, "--csv", link)[0] == 0
    assert link.is_symlink() and target.read_text().startswith("id,arrival_ms")


def test_devices_stay_devices(capsys):
    rc, _, err = cli(capsys, "simulate", WORKLOAD, "--out", "/dev/null")
    assert rc == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert cli(capsys, "export", TRACE, "--csv", "/dev/null")[0] == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if os.path.exists("/dev/full"):
        rc, _, err = cli(capsys, "export", TRACE, "--csv", "/dev/full")
        assert rc == 2 and "No space left on device" in err and err.count("\n") == 1
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_is_written_into_when_read_and_refused_without_a_reader(tmp_path, capsys):
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    rc, _, err = cli(capsys, "export", TRACE, "--csv", fifo)
    assert rc == 2 and "no process is reading the FIFO" in err        # at once, no hang
    got = []
    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())
    reader = threading.Thread(target=read)
    reader.start()
    import time
    time.sleep(0.2)
    assert cli(capsys, "export", TRACE, "--csv", fifo)[0] == 0
    reader.join(10)
    assert got and got[0].startswith(b"id,arrival_ms") and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_socket_and_a_directory_name_are_refused(tmp_path, capsys):
    sock = tmp_path / "s.csv"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    try:
        rc, _, err = cli(capsys, "export", TRACE, "--csv", sock)
        assert rc == 2 and "socket" in err
    finally:
        s.close()
    rc, _, err = cli(capsys, "export", TRACE, "--csv", f"{tmp_path}/newdir/")
    assert rc == 2 and "ends with /" in err and not (tmp_path / "newdir").exists()


@pytest.mark.parametrize("flags", [["--chrome"], ["--csv"]])
def test_a_failed_write_leaves_the_old_file(tmp_path, capsys, flags, monkeypatch):
    out = tmp_path / "x.out"
    out.write_text("keep me")
    import core.analysis.export as export

    def boom(tr):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(export, "chrome_trace_json" if flags == ["--chrome"] else "metrics_csv", boom)
    rc = main(["export", TRACE, *flags, str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "No space left on device" in err and out.read_text() == "keep me"
