"""Rematerialisation (``--remat``): each layer that qualifies keeps only its inputs for the
backward pass and recomputes what it made inside (the matmul or convolution before its bias
and activation): one more forward pass for less activation memory. A layer qualifies when it
is one of Keras's own with trainable weights and no other state; the user's own run as written.
(why, and why not ``keras.RematScope``: docs/architecture.md#rematerialisation)
"""

from __future__ import annotations

import functools
from typing import Callable


def rematerialize(model, on_notice: Callable[[str], None] | None = None) -> list[str]:
    """Make the qualifying layers of ``model`` (a built ``keras.Model``; nested models are
    walked) recompute their activations in the backward pass. Returns their names, in order;
    when none qualifies, says so through ``on_notice``."""
    import keras

    names = []
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if not _qualifies(layer) or getattr(layer.call, "_mirrorfit_remat", False):
            continue
        layer.call = _recomputed(layer.call, keras.remat)
        names.append(layer.name)
    if not names and on_notice is not None:
        on_notice(
            "--remat: no layer of this model can recompute its activations (those that "
            "can are Keras's own layers with trainable weights and no other state), so "
            "it trains as without --remat"
        )
    return names


def _qualifies(layer) -> bool:
    return stateless_keras_layer(layer) and bool(layer.trainable_weights)


def stateless_keras_layer(layer) -> bool:
    """Whether ``layer`` is one of Keras's own, with no sublayers and no state of its own
    (what its call writes, run twice, would be written twice)."""
    has_sublayers = any(True for _ in layer._flatten_layers(include_self=False, recursive=False))
    return (
        type(layer).__module__.startswith("keras.")
        and not has_sublayers
        and not layer.non_trainable_variables
    )


def _recomputed(call, remat):
    """``call`` with its positional arguments through ``remat`` and its keyword arguments
    (``training``, ``mask``: Python values) closed over. The recomputation runs in the
    autocast scope of the call (mixed precision: weights read as bf16/fp16); TensorFlow's
    backward pass would otherwise recompute it in float32."""
    from keras.src.backend import get_autocast_scope

    @functools.wraps(call)
    def recomputed(*args, **kwargs):
        scope = get_autocast_scope()

        def run(*inputs):
            if scope is None:
                return call(*inputs, **kwargs)
            with type(scope)(scope.dtype):
                return call(*inputs, **kwargs)

        return remat(run)(*args)

    recomputed._mirrorfit_remat = True  # applied once, however often it is asked
    return recomputed


__all__ = ["rematerialize", "stateless_keras_layer"]
