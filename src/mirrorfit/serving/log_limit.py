"""Log lines whose cause lies outside the server (a mount that keeps failing, clients hanging
up) at most once per interval and key, each saying how many were held back: a fault that
lasts, or a client that repeats it, cannot flood the log."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger("mirrorfit.serving")


class LogLimiter:
    """``log(key, ...)`` writes a line unless one with ``key`` was written in the last
    ``interval_s`` seconds; the next line written says how many were held back."""

    def __init__(
        self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: dict[Hashable, tuple[float, int]] = {}  # key -> (written at, held back)
        self._lock = threading.Lock()  # the event loop and the poller both log

    def log(self, key: Hashable, level: int, event: str, **fields) -> bool:
        """Log ``event`` with ``fields`` unless it is too soon for ``key``; True if logged."""
        with self._lock:
            now = self._clock()
            last = self._last.get(key)
            if last is not None and now - last[0] < self.interval_s:
                self._last[key] = (last[0], last[1] + 1)
                return False
            self._last[key] = (now, 0)
        if last is not None and last[1]:
            fields["held_back"] = last[1]
        log.log(level, event, extra=fields)
        return True

    def forget(self, key: Hashable) -> None:
        """The next line for ``key`` is written at once (its cause went away)."""
        with self._lock:
            self._last.pop(key, None)


__all__ = ["LogLimiter"]
