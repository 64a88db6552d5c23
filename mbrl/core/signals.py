"""The one guard against SIGINT and SIGTERM: a long loop (training epochs, a model fit, a robot's control ticks)
polls it and stops at a safe point instead of being killed mid-step."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopSignal:
    """Within `with StopSignal() as stop:`, the first SIGINT or SIGTERM sets `stop.signum` (`stop.signal_name`)
    instead of killing. `second_aborts`: a second signal raises KeyboardInterrupt at once (a trainer, which would
    otherwise finish its epoch first); without it, later signals are ignored and the loop's safe stop still runs
    (a robot). Outside the main thread handlers cannot be installed; the guard is then inert."""

    def __init__(self, second_aborts: bool = True):
        self.second_aborts = second_aborts
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def __enter__(self) -> StopSignal:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        elif self.second_aborts:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> bool:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False
