"""Faults during tuning (issue 41, part C): nothing measured is lost, the next run resumes.

Each case runs ``tvm-fusion tune embedded --trials 8`` in its own process and injects
the fault once the manifest counts a first trial (an observable event, polled; never a
fixed sleep):

- a full disk: the log directory on a small tmpfs filled up (root, where ``mount``
  works), or a file-size limit on the tuner (``prlimit RLIMIT_FSIZE``) at the size the
  record file has reached: exit 2 with one message naming the directory and the cause;
- a read-only log directory (``chattr +i``, which stops root too): exit 2 likewise;
- the runner's worker process killed: tuning goes on and ends normally;
- Ctrl-C twice: exit 130 saying how many trials are saved.

After each, the records written before the fault are all there and a second run with
the same command resumes to the full count.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRIALS = 8
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_FUSION_COST_MODEL": "none",
       "TVM_NUM_THREADS": "1"}
RECORDS = Path("host") / "candidates" / "database_tuning_record.json"


def _tune(logs: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", str(TRIALS),
         "--logs", str(logs), "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=ENV, start_new_session=True, **kw)  # own group: we clean up after


def _trials(logs: Path) -> int:
    try:
        models = json.loads((logs / "host" / "manifest.json").read_text())["models"]
        return next(iter(models.values()))["trials"]
    except (OSError, ValueError, StopIteration, KeyError):
        return 0


def _wait_until(cond, proc, what: str, timeout_s: float = 300) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the tuner ended before {what}: {proc.communicate()}")
        if time.monotonic() > end:
            raise AssertionError(f"no {what} in {timeout_s} s")
        time.sleep(0.05)  # polling an event, not waiting for it to happen


def _records(logs: Path) -> list[bytes]:
    try:
        return (logs / RECORDS).read_bytes().splitlines()
    except OSError:
        return []


def _finish(proc) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # workers it may have left
    return proc.returncode, out, err


def _one_error(err: str, *needles: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(("error:", "internal error"))]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _resumes(logs: Path, kept: list[bytes]) -> None:
    """Every record line written before the fault is still there, and the same command
    runs to the full trial count."""
    before = _trials(logs)
    assert _records(logs)[:len(kept)] == kept
    again = subprocess.run(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", str(TRIALS),
         "--logs", str(logs), "--quiet"], capture_output=True, text=True, env=ENV,
        timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{TRIALS - before} trials this run, {TRIALS} in total" in again.stdout, again.stdout
    assert _records(logs)[:len(kept)] == kept


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or 'not root'}); the "
                    "file-size-limit case covers a full disk")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _fill(directory: Path) -> None:
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as e:
        assert e.errno == 28, e
    finally:
        os.close(fd)


def test_full_disk_mid_tune_exits_2_keeps_the_records_and_resumes(tmp_path):
    fs = tmp_path / "fs"
    with _tmpfs(fs, "8m"):
        logs = fs / "logs"
        proc = _tune(logs)
        _wait_until(lambda: _trials(logs) >= 1, proc, "first trial")
        _fill(fs)
        code, out, err = _finish(proc)
        kept = _records(logs)
        assert code == 2, out + err
        _one_error(err, f"cannot write the tuning logs in {logs / 'host'}",
                   "no space left on the device", "run the same command again to resume")
        assert len(kept) >= 1
        (fs / "filler").unlink()
        _resumes(logs, kept)


def _ignore_sigxfsz():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG instead


def test_file_size_limit_mid_tune_exits_2_and_resumes(tmp_path):
    logs = tmp_path / "logs"
    proc = _tune(logs, preexec_fn=_ignore_sigxfsz)
    _wait_until(lambda: _trials(logs) >= 1 and _records(logs), proc, "first record")
    size = (logs / RECORDS).stat().st_size
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (size, hard))  # no byte more
    code, out, err = _finish(proc)
    assert code == 2, out + err
    _one_error(err, "cannot write the tuning logs", "file-size limit")
    kept = _records(logs)
    assert len(kept) >= 1 and (logs / RECORDS).stat().st_size <= size
    _resumes(logs, [line for line in kept if line.endswith(b"]")])  # a torn line is skipped


def test_log_directory_made_read_only_mid_tune_exits_2_and_resumes(tmp_path):
    logs = tmp_path / "logs"
    proc = _tune(logs)
    _wait_until(lambda: _trials(logs) >= 1, proc, "first trial")
    tdir = logs / "host"
    frozen = subprocess.run(["chattr", "+i", str(tdir)], capture_output=True, text=True)
    if frozen.returncode != 0:
        _finish(proc)
        pytest.skip(f"chattr +i is not available here ({frozen.stderr.strip()})")
    try:
        code, out, err = _finish(proc)
    finally:
        subprocess.run(["chattr", "-i", str(tdir)], capture_output=True)
    assert code == 2, out + err
    _one_error(err, f"cannot write the tuning logs in {tdir}", "not permitted",
               "make it writable")
    _resumes(logs, _records(logs))


def _workers(parent: int) -> list[tuple[int, int]]:
    """(start time, pid) of the tuner's worker processes (MetaSchedule's popen pool)."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            stat = Path(d, "stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(d, "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and b"popen_worker" in cmd:
            found.append((int(stat[19]), int(d[6:])))
    return sorted(found)


def test_runner_process_killed_mid_tune_loses_nothing(tmp_path):
    logs = tmp_path / "logs"
    proc = _tune(logs)
    _wait_until(lambda: _trials(logs) >= 1, proc, "first trial")
    # the builder's worker starts first, the runner's when the first build is measured
    _wait_until(lambda: len(_workers(proc.pid)) >= 2, proc, "runner worker")
    kept = _records(logs)
    os.kill(_workers(proc.pid)[-1][1], signal.SIGKILL)
    code, out, err = _finish(proc)
    assert code == 0, out + err
    assert "Traceback" not in err and "error" not in err.lower(), err
    assert f"{TRIALS} in total" in out, out
    assert _records(logs)[:len(kept)] == kept and len(_records(logs)) >= len(kept)


def test_ctrl_c_twice_exits_130_saying_what_is_saved_and_resumes(tmp_path):
    logs = tmp_path / "logs"
    proc = _tune(logs)
    _wait_until(lambda: _trials(logs) >= 1, proc, "first trial")
    os.killpg(proc.pid, signal.SIGINT)
    first = []
    for line in proc.stderr:  # the tuner's answer to the first (two at once may merge)
        first.append(line)
        if "Ctrl-C again to abort" in line:
            break
    assert first and "Ctrl-C again to abort" in first[-1], first
    os.killpg(proc.pid, signal.SIGINT)  # the second, as a terminal sends it: abort
    code, out, err = _finish(proc)
    err = "".join(first) + err
    assert code == 130, out + err
    assert "Traceback" not in err and "internal error" not in err, err
    saved = _trials(logs)
    assert f"interrupted: {saved} trials are saved in {logs / 'host'}" in err, err
    assert "run the same command again to resume" in err
    _resumes(logs, _records(logs))


def test_candidates_past_the_run_timeout_are_killed_logged_and_not_rerun(tmp_path):
    """Every candidate runs 5 repeats of at least 10 ms, so ``--run-timeout 0.04`` kills
    each: tuning still ends normally, says how many were killed, logs each to
    rejected.jsonl as timed out; the next run (default timeout) resumes at the count and
    measures the rest."""
    logs = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", "4",
         "--logs", str(logs), "--quiet", "--run-timeout", "0.04"],
        capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "4 candidates killed by the runner after 0.04 s (--run-timeout)" in proc.stdout, \
        proc.stdout
    rows = [json.loads(line) for line in
            (logs / "host" / "rejected.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["timed_out"] for r in rows), rows
    assert all("Timeout, killed after 0.04 seconds" in r["error"] for r in rows), rows
    assert _trials(logs) == 4
    killed = _records(logs)
    assert len(killed) == 4  # MetaSchedule keeps them as failed: a resume skips them
    again = subprocess.run(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", "8",
         "--logs", str(logs), "--quiet"], capture_output=True, text=True, env=ENV,
        timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "4 trials this run, 8 in total" in again.stdout, again.stdout
    assert "killed by the runner" not in again.stdout, again.stdout
    assert _records(logs)[:4] == killed and len(_records(logs)) == 8


def test_run_timeout_must_be_positive(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "tvm_fusion", "tune", "embedded", "--trials", "4",
         "--logs", str(tmp_path), "--run-timeout", "0"],
        capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 2 and "--run-timeout: must be a positive number" in \
        proc.stderr, proc.stderr
