"""What a built Keras model takes and gives, as its declared shapes say (plain attribute
reads: no framework imported here)."""

from __future__ import annotations


def input_shape_of(model) -> tuple[int, ...] | None:
    """One example's shape as the model takes it (one input, every size known), else None."""
    shape = getattr(model, "input_shape", None)
    if isinstance(shape, tuple) and len(shape) > 1 and all(isinstance(d, int) for d in shape[1:]):
        return tuple(shape[1:])
    return None


def classes_of(model) -> int | None:
    """The model's classes: its one output's last axis (at least 2), else None."""
    shape = getattr(model, "output_shape", None)
    if isinstance(shape, tuple) and shape and isinstance(shape[-1], int) and shape[-1] > 1:
        return shape[-1]
    return None


__all__ = ["classes_of", "input_shape_of"]
