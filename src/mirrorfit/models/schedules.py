"""Learning-rate scaling for large global batches, after Goyal et al. (2017), "Accurate, Large
Minibatch SGD: Training ImageNet in 1 Hour": scale the rate linearly with the global batch, and
ramp up to it over the first epochs so the early, large updates do not diverge.
"""

from __future__ import annotations

import keras
import numpy as np

from mirrorfit.errors import ConfigError

LR_SCALINGS = ("none", "linear")
_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop"}


def build_optimizer(name: str, lr):
    """A Keras optimizer by name (sgd, adam, adamw, rmsprop) with learning rate ``lr`` (a float
    or a Keras schedule): what ``--optimizer`` and ``--lr`` make."""
    return getattr(keras.optimizers, _OPTIMIZERS[name.lower()])(learning_rate=lr)


def scaled_lr(lr: float, *, global_batch: int, base_batch: int, scaling: str = "none") -> float:
    """The learning rate for ``global_batch``: ``lr`` x global/base under ``linear`` scaling."""
    if scaling not in LR_SCALINGS:
        raise ConfigError(
            f"unknown lr scaling {scaling!r}; choose one of: {', '.join(LR_SCALINGS)}"
        )
    return lr * global_batch / base_batch if scaling == "linear" else lr


@keras.saving.register_keras_serializable(package="mirrorfit")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from ``initial_lr`` to ``target_lr`` over ``warmup_steps`` optimizer
    steps, then constant ``target_lr``."""

    def __init__(self, target_lr: float, warmup_steps: int, initial_lr: float) -> None:
        self.target_lr = float(target_lr)
        self.warmup_steps = int(warmup_steps)
        self.initial_lr = float(initial_lr)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        done = keras.ops.minimum(1.0, (step + 1.0) / max(self.warmup_steps, 1))
        return self.initial_lr + (self.target_lr - self.initial_lr) * done

    def get_config(self) -> dict:
        return {
            "target_lr": self.target_lr,
            "warmup_steps": self.warmup_steps,
            "initial_lr": self.initial_lr,
        }


def learning_rate(
    lr: float, *, global_batch: int, base_batch: int, scaling: str, warmup_steps: int
) -> float | LinearWarmup:
    """What to give the optimizer: the (scaled) rate, or a warm-up to it.

    The warm-up starts from the unscaled ``lr`` (Goyal et al.); when nothing was scaled, from 0.
    """
    target = scaled_lr(lr, global_batch=global_batch, base_batch=base_batch, scaling=scaling)
    # The optimizer holds the rate in float32: past its range it is inf, and the run trains NaN.
    if not target < float(np.finfo(np.float32).max) or np.float32(target) <= 0:
        how = (
            f" scaled to {target:g} (x {global_batch}/{base_batch}, --lr-scaling linear)"
            if target != lr
            else ""
        )
        fix = "lower --lr or raise --base-batch" if target != lr else "use e.g. --lr 0.01"
        raise ConfigError(f"--lr {lr:g}{how} is not a usable float32 learning rate; {fix}")
    if warmup_steps <= 0:
        return target
    return LinearWarmup(
        target_lr=target, warmup_steps=warmup_steps, initial_lr=lr if target != lr else 0.0
    )


__all__ = ["LR_SCALINGS", "LinearWarmup", "build_optimizer", "learning_rate", "scaled_lr"]
