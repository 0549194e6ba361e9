"""Tuning beside other work says so before it measures (tvm_fusion/tune/busy.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tvm_fusion as tf
from tvm_fusion.embedded import build_embedded_model
from tvm_fusion.tune.busy import BUSY_CORES, busy_warning, other_cores_busy
from tvm_fusion.tune.driver import BusyMachineWarning

SPIN = "import sys\nopen(sys.argv[1], 'w').close()\nwhile True:\n    pass\n"


@pytest.fixture
def spinner(tmp_path):
    """A process that keeps one core busy (started: its flag file exists)."""
    flag = tmp_path / "spinning"
    proc = subprocess.Popen([sys.executable, "-c", SPIN, str(flag)])
    try:
        while not flag.exists():
            if proc.poll() is not None:
                pytest.fail("the spinning process exited")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_spinning_process_counts_as_a_busy_core_and_tuning_warns(spinner, tmp_path):
    if other_cores_busy(0.05) is None:
        pytest.skip("no /proc/stat on this system")
    # one spinning process: near a core (less when the cores are shared with more work)
    assert other_cores_busy(0.5) > BUSY_CORES
    text = busy_warning()
    assert text and "the machine is busy" in text and "quiet machine" in text
    with pytest.warns(BusyMachineWarning, match="the machine is busy"):
        tf.tune(tf.import_model(build_embedded_model(), name="embedded"), "host", trials=2,
                logs=tmp_path / "logs", progress=False)
