"""Per-epoch progress bars (rich) showing loss, accuracy and examples/s."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class EpochProgress:
    """A progress bar per epoch; ``update`` is cheap to call, it redraws at most 10x/s.

    Bars are drawn where they can redraw in place (a terminal, a notebook) only. Elsewhere (CI,
    ``| tee``, a log file) rich prints every bar once when they stop, repeating the per-epoch
    lines the run already printed.
    """

    def __init__(self, *, console: Console | None = None, enabled: bool = True) -> None:
        console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
            disable=not (enabled and (console.is_interactive or console.is_jupyter)),
            refresh_per_second=10,
        )
        self._task = None

    def __enter__(self) -> "EpochProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    @property
    def shown(self) -> bool:
        """Whether a bar is drawn (not with --no-progress, nor where no terminal shows it)."""
        return not self._progress.disable

    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        self._task = self._progress.add_task("", total=steps, epoch=f"{epoch}/{epochs}", stats="")

    def update(self, completed: int, logs: dict[str, float]) -> None:
        stats = "  ".join(f"{k} {_fmt(v)}" for k, v in logs.items())
        self._progress.update(self._task, completed=completed, stats=stats)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4f}"
