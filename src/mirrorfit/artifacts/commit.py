"""A checkpoint's commit, shared by both checkpoint formats: the work that ends a save (waiting
for an engine's background files, meta.json, the rename into place, pruning), run in the
saving thread or a background one, and what failed raised once, as one line, in the caller's
thread. (why background: docs/jax.md#checkpoints)
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

from mirrorfit import _io
from mirrorfit.artifacts.checkpoint_meta import CheckpointError
from mirrorfit.errors import MirrorfitError


class Commit(threading.Thread):
    """``work()`` for checkpoint ``final`` in this thread (:meth:`run`) or a background one
    (:meth:`start`); ``kept``: what stays the newest if it fails (in the message);
    ``cleanup()``: after a failure (the temporary folder removed)."""

    def __init__(
        self,
        final: Path,
        work: Callable[[], None],
        kept: str,
        cleanup: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name=f"mirrorfit-commit-{final.name}", daemon=False)
        self.final, self.kept = final, kept
        self._work, self._cleanup = work, cleanup
        self._error: BaseException | None = None

    def run(self) -> None:
        try:
            with _io.disk_full_hint(f"checkpoint {self.final}", self.kept):
                self._work()
        except BaseException as e:  # noqa: BLE001 - raised by result(), in the caller's thread
            self._error = e
            self._cleanup()

    def result(self) -> None:
        """Raise what failed (StorageError for a full disk, CheckpointError otherwise)."""
        error, self._error = self._error, None
        if error is None:
            return
        if isinstance(error, (MirrorfitError, KeyboardInterrupt, SystemExit)):
            raise error
        raise CheckpointError(
            f"saving checkpoint {self.final} failed ({why(error)}); {self.kept}"
        ) from error


def why(error: BaseException) -> str:
    """``Type: first line of the message`` (200 characters at most)."""
    first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
