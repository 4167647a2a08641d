"""Stop a run whose numbers are no longer finite, instead of training NaNs to the end.

Keras's ``fit`` trains on through a NaN loss unless ``TerminateOnNaN`` is given; mirrorfit's
CLI stops by default (``--allow-nan`` trains on as Keras does): a NaN run that ends with
``done``, exit 0, and exports version 0001 is a silently wrong result.
"""

from __future__ import annotations

import math

from mirrorfit.errors import DivergedError

_TRY = (
    "try a lower --lr (or --warmup-epochs), --precision fp32 or bf16 if it is fp16, or "
    "--allow-nan to train on as Keras does"
)


class DivergenceGuard:
    """A controller hook (after every compiled execution, before the checkpoint's): raises
    DivergedError once the epoch's mean training loss is NaN or infinite, naming the step, the
    last finite loss and the newest checkpoint of ``checkpoints`` (a Checkpointer, or None).
    Its ``epoch_callback`` checks the weights too: a NaN can reach them while the loss that
    was averaged stays finite (a NaN input on TensorFlow)."""

    def __init__(self, trainer, *, checkpoints=None) -> None:
        self._trainer = trainer
        self._checkpoints = checkpoints  # a Checkpointer, or None
        self.last: tuple[int, float] | None = None  # (global step, loss) last seen finite

    def epoch_callback(self, epoch: int, logs: dict) -> None:
        from mirrorfit.artifacts.finite import first_non_finite

        bad = first_non_finite(self._trainer.model.weights)
        if bad is not None:
            raise DivergedError(
                f"after epoch {epoch} (global step {self._trainer.step}) the "
                f"weights are not finite ({bad}) though the loss is "
                f"{logs.get('loss', float('nan')):.6g}; stopped{self._kept()}; "
                "look for NaN or infinite values in the data; " + _TRY
            )

    def hook(self, trainer) -> None:
        loss = trainer.train_loss()
        if math.isfinite(loss):
            self.last = (trainer.step, loss)
            return
        raise DivergedError(
            f"the training loss is {loss} after global step {trainer.step} "
            f"({self._last()}); stopped{self._kept()}; {_TRY}"
        )

    def _last(self) -> str:
        if self.last is None:
            return "not finite at the first check"
        step, loss = self.last
        return f"last finite: {loss:.6g} at step {step}"

    def _kept(self) -> str:
        return kept_checkpoint(self._checkpoints)


def kept_checkpoint(checkpointer) -> str:
    """``"; the newest checkpoint is DIR/ckpt-N"`` where the checkpointer has one (this run
    writes finite ones only; one of an earlier --allow-nan run may not be)."""
    found = checkpointer.checkpoints() if checkpointer is not None else []
    return f"; the newest checkpoint is {found[-1]}" if found else ""


def check_updates(trainer) -> None:
    """DivergedError for an fp16 run that trained steps but applied none: every step's
    gradients overflowed, and the weights are the initial ones."""
    if trainer.runner.loss_scaling and trainer.step and not trainer.runner.applied_steps():
        raise DivergedError(
            f"every one of the {trainer.step} optimizer steps was skipped for "
            "non-finite fp16 gradients: the weights never changed; "
            "scale the inputs down, try --precision bf16 or fp32, or a lower "
            "--lr"
        )
