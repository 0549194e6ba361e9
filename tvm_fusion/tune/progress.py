"""Progress on stderr: a one-line bar for tuning (trials, best predicted model latency,
ETA), and the stage a long command such as ``plan`` is in."""

from __future__ import annotations

import sys
import threading
import time


def _fmt_s(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class Progress:
    """Draws ``[####----] 12/48 trials  best 1.23 ms  eta 1m05s`` on stderr.

    On a terminal the line is redrawn in place; elsewhere (CI, notebooks capturing
    output) one line is printed per update.
    """

    def __init__(self, total: int, *, done: int = 0, enabled: bool = True, stream=None):
        self.total, self.done, self.start_done = total, done, done
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def update(self, done: int, best_ms: float | None, note: str = "") -> None:
        """Record ``done`` trials in total and the best predicted model latency."""
        self.done = done
        if not self.enabled:
            return
        width = 24
        frac = min(done / self.total, 1.0) if self.total else 1.0
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        ran = done - self.start_done
        elapsed = time.monotonic() - self.t0
        eta = elapsed / ran * (self.total - done) if ran > 0 else float("nan")
        best = f"best {best_ms:.3f} ms" if best_ms is not None else "best -"
        eta_s = _fmt_s(eta) if eta == eta else "?"
        line = f"[{bar}] {done}/{self.total} trials  {best}  eta {eta_s}  {note}".rstrip()
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """Say what a stage after the search is doing (on a terminal, in the bar's
        line; else a line of its own), so minutes of it do not pass in silence."""
        if not self.enabled:
            return
        self.stream.write(f"\r\033[K{text}" if self.tty else f"{text}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()


class Stages:
    """Says on stderr which stage a long command is in, e.g. ``plan: [ 12.4 s] layout
    NCHW16c: planning 670 ops``: nothing for the first ``after_s`` seconds (a quick
    command prints nothing), then the stage running at that moment and each one after.

    Call it with each stage as it begins; :meth:`close` at the end (says how long it
    took, if anything was said). ``after_s=0`` says every stage at once.
    """

    def __init__(self, command: str, *, after_s: float = 3.0, enabled: bool = True,
                 stream=None):
        self.command, self.enabled = command, enabled
        self.stream = stream or sys.stderr
        self.t0 = time.monotonic()
        self.current: str | None = None
        self.shown = enabled and after_s <= 0
        self._lock = threading.Lock()
        self._timer = None
        if enabled and after_s > 0:
            self._timer = threading.Timer(after_s, self._wake)
            self._timer.daemon = True
            self._timer.start()

    def _say(self, text: str) -> None:
        self.stream.write(f"{self.command}: [{time.monotonic() - self.t0:6.1f} s] {text}\n")
        self.stream.flush()

    def _wake(self) -> None:
        with self._lock:
            self.shown = True
            if self.current is not None:
                self._say(self.current)

    def __call__(self, stage: str) -> None:
        with self._lock:
            self.current = stage
            if self.shown:
                self._say(stage)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            if self.shown:
                self.stream.write(f"{self.command}: done in "
                                  f"{time.monotonic() - self.t0:.1f} s\n")
                self.stream.flush()
            self.shown = False
