"""Mixed precision as a value: which Keras dtype policy builds the model, and loss scaling.
``Precision("bf16")``: layers under ``mixed_bfloat16`` (bfloat16 compute, float32 variables);
``"fp16"``: ``mixed_float16`` with a dynamic loss scale. Keras's policy is process-wide, so it is
set only inside :meth:`Precision.building` and restored after.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from mirrorfit.errors import ConfigError

# Keras is imported where it is used: the CLI's flag checks (bench's report reads
# COMPUTE_DTYPES) run before TensorFlow loads, which takes seconds.
if TYPE_CHECKING:
    import keras

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# Dtype of the matmuls each precision computes in (for the peak FLOP/s it is measured against).
COMPUTE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Precision:
    """Training precision: ``fp32``, ``bf16`` or ``fp16`` (dynamic loss scaling).

    ``initial_scale`` and ``growth_steps`` configure fp16's loss scale: a step whose gradients
    are not finite is skipped and the scale halved; after ``growth_steps`` good steps in a row
    the scale doubles.
    """

    name: str = "fp32"
    initial_scale: float = 2.0**15
    growth_steps: int = 2000

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ConfigError(
                f"unknown precision {self.name!r}; choose one of: {', '.join(POLICIES)}"
            )

    @property
    def policy(self) -> str:
        """The Keras dtype policy name."""
        return POLICIES[self.name]

    @property
    def compute_dtype(self) -> str:
        return COMPUTE_DTYPES[self.name]

    @property
    def loss_scaling(self) -> bool:
        """Whether gradients go through a dynamic loss scale (fp16 only: bf16 has fp32's range)."""
        return self.name == "fp16"

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Build layers inside this block to get this precision (rematerialisation is applied
        to the built model: :func:`mirrorfit.models.remat.rematerialize`)."""
        import keras

        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(self.policy)
        try:
            yield
        finally:
            keras.config.set_dtype_policy(previous)

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """The optimizer to train with: fp16 wraps it in a dynamic ``LossScaleOptimizer``."""
        import keras

        if not self.loss_scaling or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            return optimizer
        return keras.optimizers.LossScaleOptimizer(
            optimizer, initial_scale=self.initial_scale, dynamic_growth_steps=self.growth_steps
        )


def as_precision(value: Precision | str) -> Precision:
    """Accept a :class:`Precision` or its name."""
    return value if isinstance(value, Precision) else Precision(value)


__all__ = ["Precision", "as_precision", "POLICIES"]
