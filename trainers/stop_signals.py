"""Stopping a run cleanly: the first Ctrl-C (SIGINT) or SIGTERM (``kill``, ``docker stop``, a
scheduler's preemption) asks the run to finish its unit of work (an RL iteration, an SFT step), save
and exit; a second one quits at once, the run's clean-up still running (``KeyboardInterrupt`` for
Ctrl-C, ``SystemExit(143)`` for SIGTERM). Handlers are installed only in the main thread (Python
allows no other) and put back when the run ends, so a finished run leaves the process's signals as
they were."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """``with GracefulStop("finishing this step and saving the model") as stop: ... if stop.requested:``.
    ``on_request`` (optional) is called on the first signal, beside setting ``requested``."""

    def __init__(self, what: str, on_request: Callable[[], None] | None = None):
        self.what = what
        self.on_request = on_request
        self.requested = False
        self._previous: dict[int, Any] = {}

    def install(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def restore(self) -> None:
        for sig, h in self._previous.items():
            signal.signal(sig, h if h is not None else signal.SIG_DFL)
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.requested:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"\n{name}: {self.what} (send it again, or Ctrl-C, to quit now)", flush=True)
        self.requested = True
        if self.on_request is not None:
            self.on_request()
