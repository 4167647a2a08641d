"""Per-epoch progress bars (rich) showing loss, accuracy and examples/s."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)


class EpochProgress:
    """A progress bar per epoch; ``update`` is cheap to call, it redraws at most 10x/s."""

    def __init__(self, *, console: Console | None = None, enabled: bool = True) -> None:
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
            console=console, disable=not enabled, refresh_per_second=10,
        )
        self._task = None

    def __enter__(self) -> "EpochProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        self._task = self._progress.add_task("", total=steps, epoch=f"{epoch}/{epochs}",
                                             stats="")

    def update(self, completed: int, logs: dict[str, float]) -> None:
        stats = "  ".join(f"{k} {_fmt(v)}" for k, v in logs.items())
        self._progress.update(self._task, completed=completed, stats=stats)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4f}"
