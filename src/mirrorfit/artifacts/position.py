"""Where the built-in loop stands, in optimizer steps: what the controller advances and what its
checkpoints record and restore."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping


@dataclass(frozen=True)
class Position:
    """Where training is, in optimizer steps (units of the global batch)."""

    epoch: int = 0  # epochs completed (their steps, validation and callbacks)
    step_in_epoch: int = 0  # steps completed in the current epoch
    step: int = 0  # optimizer steps completed in all
    # At an epoch's last step, before that epoch's end (validation, callbacks) ran: its training
    # logs. A checkpoint saved there keeps them, so that a run resumed from it ends that epoch
    # with the metrics it trained with.
    epoch_logs: Mapping[str, float] | None = field(default=None, hash=False)
    # At an epoch's last step: that epoch's end counts as done. Only a checkpoint of format < 4
    # says so: its epoch-end save kept the step hook's position, so it cannot tell.
    ended: bool = False

    def advanced(self, steps: int) -> "Position":
        return replace(
            self,
            step_in_epoch=self.step_in_epoch + steps,
            step=self.step + steps,
            epoch_logs=None,
            ended=False,
        )

    def at_epoch_end(self, logs: Mapping[str, float]) -> "Position":
        return replace(self, epoch_logs=dict(logs))

    def epoch_done(self, epoch: int) -> "Position":
        return replace(self, epoch=epoch, step_in_epoch=0, epoch_logs=None, ended=False)


__all__ = ["Position"]
