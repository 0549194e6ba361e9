"""A MetaSchedule database over stock JSONDatabase files that survives crashes and sharing.

The files are MetaSchedule's own (``database_workload.json``: one ``[shash, module]``
line per workload; ``database_tuning_record.json``: one ``[workload line, record]`` line
per record), so stock ``ms.database.JSONDatabase`` reads a clean directory. What stock
TVM does not do, and this class does:

- **Reading** skips a corrupt or truncated line instead of crashing, and says once how
  many it skipped. A bad workload line still counts as a line, so the workload indices
  of the records after it stay right.
- **Writing** appends one whole line per ``write`` (then fsync) under an exclusive
  ``flock`` on ``.lock``, after reading what other processes appended since. Stock
  JSONDatabase numbers workloads by what *it* has seen, so two tuners sharing a
  directory give records the wrong workload index; here the index is the line the
  workload really has in the file. A line left unterminated by a killed writer is closed
  before the next append, so it costs only itself.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api as ms_ffi
from tvm.s_tir.meta_schedule.utils import _json_de_tvm
from tvm.s_tir.meta_schedule.database import PyDatabase

from ..errors import LogError

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
LOCK_FILE = ".lock"

FAILED_RUN_S = 1e9
"""MetaSchedule writes 1e10 s as the run time of a candidate that failed to build or run:
a record at or above this is a failure, not a time."""

PREDICTED_RUN_S = 100.0
"""``run_secs`` of a record no device measured (a cost model's pick): valid for
MetaSchedule's databases (whose readers skip failed runs), slower than any real kernel."""


def is_measured(run_secs) -> bool:
    """Whether ``run_secs`` is a measurement: not empty and not a failed run."""
    secs = [float(s) for s in run_secs or ()]
    return bool(secs) and max(secs) < FAILED_RUN_S


def is_workload_row(obj) -> bool:
    """A workload line's shape: ``[structural hash, module JSON]``, both strings."""
    return isinstance(obj, list) and len(obj) == 2 and all(isinstance(x, str) for x in obj)


def is_record_row(obj) -> bool:
    """A record line's shape: ``[workload line index, record]``."""
    return isinstance(obj, list) and len(obj) == 2 and isinstance(obj[0], int)


def read_rows(db_dir: str | os.PathLike) -> tuple[list, list]:
    """The JSON rows of a database's two files, in file order, no TVM object built.

    For tools that read many records at once (curves, datasets, statistics);
    :class:`LogDatabase` is the MetaSchedule database over the same files.

    Returns
    -------
    (list, list)
        Workload rows (``[shash, module]``) and record rows (``[workload index,
        record]``); a line that is not such a row is None in its place, so the workload
        indices the records use stay right. A missing file reads as no rows.
    """
    out = []
    for name, ok in ((WORKLOAD_FILE, is_workload_row), (RECORD_FILE, is_record_row)):
        rows = []
        try:
            data = (Path(db_dir) / name).read_bytes()
        except FileNotFoundError:
            data = b""
        for raw in data.splitlines():
            try:
                row = json.loads(raw)
            except ValueError:  # a torn or corrupt line
                row = None
            rows.append(row if ok(row) else None)
        out.append(rows)
    return out[0], out[1]


def read_run_times(db_dir: str | os.PathLike) -> tuple[list, list[tuple[int, list[float]]]]:
    """Workload hashes (None for an unreadable line) and ``(workload index, run_secs)``
    of every readable record, in file order (see :func:`read_rows`)."""
    workloads, records = read_rows(db_dir)
    times = []
    for row in records:
        try:
            times.append((row[0], [float(s) for s in (row[1][1] or [])]))
        except (TypeError, IndexError, KeyError, ValueError):  # None, or no run_secs
            continue
    return [w[0] if w else None for w in workloads], times


# A LogError raised inside a database method that MetaSchedule called through the FFI
# comes back out as a LogError, not a bare RuntimeError.
tvm_ffi.register_error(LogError)


class CorruptLogWarning(UserWarning):
    """Lines of a tuning database that could not be read were skipped."""


@dataclass(frozen=True, kw_only=True)
class BadLine:
    """One skipped line: which file, which line (1-based) and why."""

    file: str
    line: int
    reason: str


# ---- locking --------------------------------------------------------------------------

_held: dict[str, list] = {}  # lock path -> [fd, depth, exclusive]; flock is per open file
_held_mutex = threading.RLock()


class DirLock:
    """``flock`` on ``DIR/.lock``; re-entrant within a process.

    ``exclusive=False`` takes a shared lock (readers), ``True`` an exclusive one
    (writers). A directory where the lock file cannot be created (read-only media)
    is read without a lock; writing there fails anyway.
    """

    def __init__(self, directory: Path, *, exclusive: bool):
        self.path = str(Path(directory) / LOCK_FILE)
        self.exclusive = exclusive

    def __enter__(self) -> "DirLock":
        _held_mutex.acquire()
        held = _held.get(self.path)
        if held is not None:
            if self.exclusive and not held[2]:
                if held[0] is None:
                    _held_mutex.release()
                    raise LogError(f"cannot lock {self.path} for writing")
                fcntl.flock(held[0], fcntl.LOCK_EX)  # upgrade a shared lock we hold
                held[2] = True
            held[1] += 1
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            if self.exclusive:
                _held_mutex.release()
                raise
            _held[self.path] = [None, 1, False]
            return self
        fcntl.flock(fd, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
        _held[self.path] = [fd, 1, self.exclusive]
        return self

    def __exit__(self, *exc) -> None:
        held = _held[self.path]
        held[1] -= 1
        if held[1] == 0:
            del _held[self.path]
            if held[0] is not None:
                fcntl.flock(held[0], fcntl.LOCK_UN)
                os.close(held[0])
        _held_mutex.release()


def append_line(path: Path, line: str) -> None:
    """Append ``line`` + newline in one ``write``, then fsync; the caller holds the lock.

    If the file does not end with a newline (a writer died mid-line), a newline is
    written first, so the broken line stays one bad line instead of eating this one.
    """
    data = line.encode()
    if b"\n" in data:
        raise ValueError("a database line must not contain a newline")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data
        data += b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def dumps(obj) -> str:
    """Compact JSON, as MetaSchedule writes it."""
    return json.dumps(obj, separators=(",", ":"))


def record_json(record: ms.database.TuningRecord) -> list:
    """``record.as_json()`` as MetaSchedule's own JSONDatabase writes it.

    The layout map of a ``TransformLayout`` step (``RewriteLayout``'s, in every prepacked
    kernel) becomes its ``tvm.ir.save_json`` string, as the C++ writer does and as
    ``TuningRecord.from_json`` reads it back; TVM's Python unpacker refuses IndexMaps.
    """
    def unpack(obj):
        if isinstance(obj, tvm.tirx.IndexMap):
            return tvm.ir.save_json(obj)
        if isinstance(obj, tvm_ffi.Array):
            return [unpack(x) for x in obj]
        if isinstance(obj, tvm_ffi.Map):
            return {unpack(k): unpack(v) for k, v in obj.items()}
        return _json_de_tvm(obj)

    return unpack(ms_ffi.TuningRecordAsJSON(record))


# ---- the database ---------------------------------------------------------------------

@derived_object
class LogDatabase(PyDatabase):
    """A MetaSchedule database over ``DIR/database_*.json``, robust to crashes and sharing.

    Parameters
    ----------
    path : path
        Directory of the two database files.
    writable : bool
        Allow commits (creates the directory). A read-only database never writes.
    warn : bool
        Emit one :class:`CorruptLogWarning` if lines were skipped while loading.

    Attributes
    ----------
    bad_lines : list of BadLine
        Every line skipped so far, loading and later syncs together.
    """

    def __init__(self, path: str | os.PathLike, *, writable: bool = False, warn: bool = True):
        super().__init__()
        self.path = Path(path)
        self.writable = writable
        if writable:
            self.path.mkdir(parents=True, exist_ok=True)
        self._files = {WORKLOAD_FILE: self.path / WORKLOAD_FILE,
                       RECORD_FILE: self.path / RECORD_FILE}
        self._reset()
        with DirLock(self.path, exclusive=writable):
            self._sync()
            if writable:
                self._close_torn_tails()
        if warn and self._bad:
            warnings.warn(self.bad_summary(), CorruptLogWarning, stacklevel=3)

    # -- reading --

    @property
    def bad_lines(self) -> list[BadLine]:
        return sorted(self._bad.values(), key=lambda b: (b.file != WORKLOAD_FILE, b.line))

    def bad_summary(self) -> str:
        """One sentence on the skipped lines (for the warning and the tools)."""
        bad = self.bad_lines
        per_file = {f: sum(b.file == f for b in bad) for f in self._files}
        parts = ", ".join(f"{n} in {f}" for f, n in per_file.items() if n)
        first = bad[0]
        return (f"skipped {len(bad)} unreadable line(s) of the tuning database in "
                f"{self.path} ({parts}; first: {first.file} line {first.line}: "
                f"{first.reason}); the other records are used. `tvm-fusion logs prune "
                f"{self.path.parent if self.path.name == 'candidates' else self.path}` "
                "rewrites the files without them.")

    def _reset(self) -> None:
        self._mem = ms.database.MemoryDatabase()
        self._offset = {WORKLOAD_FILE: 0, RECORD_FILE: 0}
        self._lines = {WORKLOAD_FILE: 0, RECORD_FILE: 0}  # complete lines consumed
        self._inode = {WORKLOAD_FILE: None, RECORD_FILE: None}
        self._workloads: list = []        # line index -> canonical Workload, or None
        self._index: dict = {}            # canonical Workload -> first line index
        self._key: dict = {}              # canonical Workload -> structural hash string
        self._bad: dict[tuple[str, int], BadLine] = {}
        self.record_lines = 0             # records read successfully

    def _sync(self) -> None:
        """Read what was appended since the last sync (workloads first, then records).

        A file replaced meanwhile (``logs prune`` or ``merge`` rewrote it) renumbers the
        workloads: then everything is read again, so no record is filed under a stale
        index.
        """
        for name, path in self._files.items():
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            seen = self._inode[name]
            if (seen is not None and seen != st.st_ino) or st.st_size < self._offset[name]:
                self._reset()
                break
        self._sync_file(WORKLOAD_FILE)
        self._sync_file(RECORD_FILE)

    def _sync_file(self, name: str) -> None:
        path = self._files[name]
        try:
            with open(path, "rb") as f:
                self._inode[name] = os.fstat(f.fileno()).st_ino
                f.seek(self._offset[name])
                data = f.read()
        except FileNotFoundError:
            return
        *complete, tail = data.split(b"\n")
        for raw in complete:
            self._lines[name] += 1
            self._offset[name] += len(raw) + 1
            self._parse(name, self._lines[name], raw)
        if tail:  # unterminated: a writer died mid-line (or is writing, when unlocked)
            self._bad[(name, self._lines[name] + 1)] = BadLine(
                file=name, line=self._lines[name] + 1,
                reason=f"truncated line ({len(tail)} bytes, no newline)")

    def _close_torn_tails(self) -> None:
        """End a last line left without a newline; the caller holds the exclusive lock.

        Under that lock no writer is mid-line, so such a tail is a writer that died
        mid-write: closing it now keeps it one bad line whether or not this writer ever
        appends (a resumed run that finds nothing faster appends no record).
        """
        for name, path in self._files.items():
            if (name, self._lines[name] + 1) in self._bad:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, b"\n")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                self._sync_file(name)

    def _parse(self, name: str, lineno: int, raw: bytes) -> None:
        self._bad.pop((name, lineno), None)  # a truncated tail may have been completed
        try:
            obj = json.loads(raw)
        except UnicodeDecodeError as e:  # a ValueError without .msg: before that branch
            self._skip(name, lineno, f"not UTF-8 text (byte {e.start})")
            return
        except ValueError as e:
            self._skip(name, lineno, f"not JSON ({e.msg} at column {e.colno})")
            return
        if name == WORKLOAD_FILE:
            self._parse_workload(lineno, obj)
        else:
            self._parse_record(lineno, obj)

    def _skip(self, name: str, lineno: int, reason: str) -> None:
        self._bad[(name, lineno)] = BadLine(file=name, line=lineno, reason=reason)
        if name == WORKLOAD_FILE:
            self._workloads.append(None)  # keep the line numbering of later workloads

    def _parse_workload(self, lineno: int, obj) -> None:
        if not is_workload_row(obj):
            self._skip(WORKLOAD_FILE, lineno, "not a [hash, module] pair")
            return
        try:
            parsed = ms.database.Workload.from_json(obj)
            wl = self._mem.commit_workload(parsed.mod)
        except Exception as e:  # TVM raises its own error types on a bad module
            self._skip(WORKLOAD_FILE, lineno, f"module does not load: {_first_line(e)}")
            return
        self._workloads.append(wl)
        self._index.setdefault(wl, lineno - 1)
        self._key.setdefault(wl, obj[0])

    def _parse_record(self, lineno: int, obj) -> None:
        if not is_record_row(obj):
            self._skip(RECORD_FILE, lineno, "not a [workload index, record] pair")
            return
        idx = obj[0]
        if idx >= len(self._workloads):
            self._sync_file(WORKLOAD_FILE)  # appended by another process after our read
        wl = self._workloads[idx] if 0 <= idx < len(self._workloads) else None
        if wl is None:
            self._skip(RECORD_FILE, lineno, f"refers to workload line {idx + 1}, which "
                       "is missing or unreadable")
            return
        try:
            rec = _replay(obj[1], wl)
        except Exception as e:  # a trace that no longer applies raises a TVM error
            self._skip(RECORD_FILE, lineno, f"record does not replay: {_first_line(e)}")
            return
        self._mem.commit_tuning_record(rec)
        self.record_lines += 1

    # -- what the tools need --

    def workloads(self) -> list:
        """Every distinct workload, in file order."""
        return sorted(self._index, key=self._index.get)

    def workload_key(self, workload) -> str:
        """The structural hash string the workload file stores for ``workload``."""
        if workload in self._key:
            return self._key[workload]
        if self._mem.has_workload(workload.mod):
            wl = self._mem.commit_workload(workload.mod)
            if wl in self._key:
                return self._key[wl]
        return str(tvm_ffi.structural_hash(workload.mod))

    def records_of(self, workload) -> list:
        """Every record of ``workload``, best first (records with run times only)."""
        return list(self._mem.get_top_k(workload, 1 << 30))

    def refresh(self) -> None:
        """Read what other processes appended since."""
        with DirLock(self.path, exclusive=False):
            self._sync()

    # -- the PyDatabase interface --

    def has_workload(self, mod) -> bool:
        return self._mem.has_workload(mod)

    def commit_workload(self, mod):
        if self._mem.has_workload(mod):
            wl = self._mem.commit_workload(mod)
            if wl in self._index:
                return wl
        self._check_writable()
        with DirLock(self.path, exclusive=True):
            self._sync()
            wl = self._mem.commit_workload(mod)
            if wl not in self._index:
                append_line(self._files[WORKLOAD_FILE], dumps(wl.as_json()))
                self._sync_file(WORKLOAD_FILE)
            return wl

    def commit_tuning_record(self, record) -> None:
        self._check_writable()
        with DirLock(self.path, exclusive=True):
            self._sync()
            wl = self.commit_workload(record.workload.mod)
            line = dumps([self._index[wl], record_json(record)])
            append_line(self._files[RECORD_FILE], line)
            self._sync_file(RECORD_FILE)

    def get_top_k(self, workload, top_k: int) -> list:
        if workload not in self._index and self._mem.has_workload(workload.mod):
            workload = self._mem.commit_workload(workload.mod)  # ours after a re-read
        return self._mem.get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> list:
        return self._mem.get_all_tuning_records()

    def __len__(self) -> int:
        return len(self._mem)

    def _check_writable(self) -> None:
        if not self.writable:
            raise LogError(f"the tuning database in {self.path} was opened read-only; "
                           "open it with writable=True to add records")


def _first_line(err: Exception) -> str:
    """The gist of a TVM error: its type and last message line."""
    lines = [ln for ln in str(err).splitlines() if ln.strip() and ln.strip() != "(not rendered)"]
    return f"{type(err).__name__}: {lines[-1][:200]}" if lines else type(err).__name__


def write_database(path: Path, entries: list) -> None:
    """Write a clean database to ``path``: ``entries`` is ``[(workload, [records])]``.

    Used by merge and prune; the caller holds ``path``'s exclusive lock. The old files
    stay as ``*.bak`` until both new ones are in place, so a crash in between leaves a
    copy to restore (``logs validate`` reports it).
    """
    path.mkdir(parents=True, exist_ok=True)
    wl_lines = [dumps(wl.as_json()) for wl, _ in entries]
    rec_lines = [dumps([i, record_json(r)]) for i, (_, recs) in enumerate(entries) for r in recs]
    tmp = {}
    for name, lines in ((WORKLOAD_FILE, wl_lines), (RECORD_FILE, rec_lines)):
        tmp[name] = path / f".{name}.new"
        with open(tmp[name], "w") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    for name in tmp:
        if (path / name).exists():
            os.replace(path / name, path / f"{name}.bak")
    for name in (WORKLOAD_FILE, RECORD_FILE):
        os.replace(tmp[name], path / name)
    for name in tmp:
        (path / f"{name}.bak").unlink(missing_ok=True)


def _replay(record_json, workload):
    """``TuningRecord.from_json`` (which replays the trace); a trace that tensorizes needs
    the tensor intrinsics registered, which a fresh process (a deployment building from
    the logs) has not done yet: register them and replay once more."""
    try:
        return ms.database.TuningRecord.from_json(record_json, workload)
    except Exception as e:  # noqa: BLE001 - re-raised unless it is the registry
        if "TensorIntrin" not in str(e) or "not registered" not in str(e):
            raise
    from ..compat.fast_import import import_tensor_intrinsics

    import_tensor_intrinsics()
    return ms.database.TuningRecord.from_json(record_json, workload)
