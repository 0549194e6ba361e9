"""Servers and knobs (issue 41, part B): what the RPC options bind and accept by default.

tvm-fusion listens on nothing; ``tune --rpc-tracker`` connects out, to this machine's
loopback unless ``--rpc-allow-remote``. A non-loopback tracker is refused before any
connection (these tests never open a socket to another address), and a time a remote
device reports is used only when it is one. Every environment variable the package
reads is listed in the README.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tvm_fusion import config
from tvm_fusion.cli import build_parser, main
from tvm_fusion.tune.measure import (MeasureError, check_tracker_host, is_loopback,
                                     make_runner, valid_secs)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost",
                                  "LOCALHOST"])
def test_loopback_hosts(host):
    assert is_loopback(host)
    check_tracker_host(host, 9190)  # no error, no connection


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "192.168.0.7", "172.16.0.1",
                                  "8.8.8.8", "::", "fe80::1"])
def test_other_hosts_are_refused_unless_allowed(host):
    assert not is_loopback(host)
    with pytest.raises(MeasureError, match=r"not on this machine's loopback.*"
                                           r"authenticate nobody.*--rpc-allow-remote"):
        check_tracker_host(host, 9190)
    check_tracker_host(host, 9190, allow_remote=True)  # allowed: checked no further here


def test_make_runner_refuses_a_remote_tracker_before_connecting(monkeypatch):
    def no_connection(*a, **k):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr("socket.create_connection", no_connection)
    with pytest.raises(MeasureError, match="10.9.8.7:9190 is not on this machine"):
        make_runner(rpc_tracker="10.9.8.7:9190", rpc_key="cpu0")


def test_cli_tune_with_a_remote_tracker_exits_2_before_importing(capsys, monkeypatch):
    import tvm_fusion.cli as cli

    def no_import(*a, **k):
        raise AssertionError("the model was imported before the tracker was checked")

    monkeypatch.setattr(cli, "_model_from_args", no_import)
    code = main(["tune", "embedded", "--trials", "4", "--logs", "/nonexistent/logs",
                 "--rpc-tracker", "192.168.1.20:9190", "--rpc-key", "gpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: --rpc-tracker 192.168.1.20:9190")
    assert "ssh -N -L 9190:127.0.0.1:9190" in err and "--rpc-allow-remote" in err
    assert "Traceback" not in err


def test_help_warns_about_allow_remote():
    tune = next(a for a in build_parser()._subparsers._group_actions[0].choices.values()
                if a.prog.endswith(" tune"))
    text = " ".join(tune.format_help().split())
    assert "--rpc-allow-remote WARNING: allow a --rpc-tracker off this machine's loopback" \
        in text
    assert "authenticates nobody" in text
    assert "--host 127.0.0.1" in text  # the commands it suggests bind the loopback


@pytest.mark.parametrize("secs,ok", [
    ([1e-5, 2e-5], True), ([3.0], True),
    ([], False), ([float("nan")], False), ([1e-5, float("inf")], False),
    ([0.0], False), ([-1e-5], False), (["fast"], False), (None, False)])
def test_only_finite_positive_times_count(secs, ok):
    assert valid_secs(secs) is ok


def test_a_forged_time_is_no_measurement():
    from tvm_fusion.tune.state import _latency_us

    good = SimpleNamespace(error_msg=None, run_secs=[2e-6, 1e-6, 3e-6])
    assert _latency_us(good) == pytest.approx(2.0)
    for forged in ([float("nan")] * 3, [-1.0], [0.0, 0.0], [float("-inf")]):
        assert _latency_us(SimpleNamespace(error_msg=None, run_secs=forged)) is None


def test_readme_lists_every_environment_variable():
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Environment variables"):]
    table = table[:table.index("\n## ")]
    listed = set(re.findall(r"^\| `([A-Z_]+)`", table, flags=re.M))
    assert {k.name for k in config.KNOBS} <= listed
    assert {"TVM_NUM_THREADS", "TVM_BIND_THREADS"} <= set(re.findall(r"`(TVM_[A-Z_]+)`",
                                                                         table))
