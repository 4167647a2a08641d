"""``--model_config_file_poll_wait_seconds``: re-read ``--model_config_file`` at that period
(seconds), as TF Serving does, and serve what it says from then on. A file that cannot be
read, parsed or applied changes nothing: the last good config keeps serving, with a warning
once per distinct problem and an info line when the file is good again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mirrorfit.errors import ConfigError
from mirrorfit.serving.model_config import ModelConfig, read_model_config_file

log = logging.getLogger("mirrorfit.serving")


class ConfigReloader:
    """Re-reads ``path`` every ``interval_s`` seconds in a thread; ``apply`` gets each new
    config (it may raise ConfigError to refuse it)."""

    def __init__(
        self,
        path: str,
        interval_s: float,
        current: list[ModelConfig],
        apply: Callable[[list[ModelConfig]], None],
    ) -> None:
        self.path, self.interval_s = path, interval_s
        self._current = current
        self._apply = apply
        self._problem: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> None:
        """Read the file; apply it if it says something new."""
        try:
            configs = read_model_config_file(self.path)
            if configs != self._current:
                self._apply(configs)
        except ConfigError as e:
            if str(e) != self._problem:  # each problem once, not once per period
                self._problem = str(e)
                log.warning(
                    "config not reloaded",
                    extra={
                        "path": self.path,
                        "error": str(e)[:1000],
                        "serving": sorted(c.name for c in self._current),
                        "action": "keeping the last good config",
                    },
                )
            return
        if configs != self._current:
            before = {c.name: c for c in self._current}
            after = {c.name: c for c in configs}
            log.info(
                "config reloaded",
                extra={
                    "path": self.path,
                    "added": sorted(after.keys() - before.keys()),
                    "removed": sorted(before.keys() - after.keys()),
                    "changed": sorted(
                        n for n in after.keys() & before.keys() if after[n] != before[n]
                    ),
                },
            )
            self._current = configs
        elif self._problem is not None:
            log.info("config file good again", extra={"path": self.path})
        self._problem = None

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.check_once()
                except Exception as e:  # noqa: BLE001 - a bug: keep serving, say so
                    log.error(
                        "config reload failed",
                        extra={"path": self.path, "error": f"{type(e).__name__}: {e}"[:500]},
                    )

        self._thread = threading.Thread(target=loop, name="config-reloader", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)


__all__ = ["ConfigReloader"]
