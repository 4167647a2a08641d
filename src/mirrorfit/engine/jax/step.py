"""The parts of the JAX step that :mod:`mirrorfit.engine.jax.keras_fit` compiles around the
model's own loss: how S steps run per call (:class:`_Train`: a loop on the devices, or one
call per step for convolutions on XLA's CPU client), the step's one all-reduce of the
gradients (:func:`all_reduce`: one buffer across processes), and per-device copies of host
values (:func:`stacked`). (why: docs/jax.md#what-it-does, docs/architecture.md#jax-the-step)
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mirrorfit.engine.jax.placement import AXIS


class _Train:
    """``train(state, xs, ys, n)``: ``n`` steps in one compiled call (a loop on the devices), or,
    for a model with convolutions on XLA's CPU client, ``n`` calls of one step each, its
    micro-batches unrolled. ``one_by_one(state, xs)`` decides at the first call, from the forward
    pass (None: always the loop).
    (why: docs/multi-worker-jax.md#on-a-cpu-one-step-per-call-for-models-with-convolutions)
    """

    def __init__(self, looped, single, one_by_one) -> None:
        self._looped, self._single, self._one_by_one = looped, single, one_by_one
        self._chosen: bool | None = None if one_by_one is not None else False

    def _choose(self, state, xs) -> bool:
        if self._chosen is None:
            self._chosen = bool(self._one_by_one(state, xs))
        return self._chosen

    def __call__(self, state, xs, ys, num_steps):
        if not self._choose(state, xs):
            return self._looped(state, xs, ys, num_steps)
        for i in range(int(num_steps)):
            state = self._single(state, xs, ys, np.int32(i))
            # One call on the devices at a time. With calls queued by JAX's asynchronous
            # dispatch, the CNN on 2 logical devices of 2 cores aborted in 2 of 3 runs with
            # XLA's "Termination timeout for all reduce ... only 1 of them arrived" (one
            # device's part never got one of the CPU client's threads); waiting here, 0 of
            # 20 runs did. The mechanism is not fully known: Keras's fit still aborts with
            # synchronous dispatch (docs/benchmarks.md).
            jax.block_until_ready(state)
        return state

    def lower(self, state, xs, ys, num_steps):
        """What one call compiles: the loop, or the one step."""
        if not self._choose(state, xs):
            return self._looped.lower(state, xs, ys, num_steps)
        return self._single.lower(state, xs, ys, np.int32(0))


def all_reduce(mesh) -> Callable:
    """The step's one all-reduce of a list of arrays over ``mesh``'s data axis: one psum of
    them all (XLA emits one all-reduce of a tuple), not of one flattened buffer on one process
    (far slower on XLA's CPU client); across processes gloo takes a tuple's arrays one by one,
    so there, one buffer (docs/benchmarks.md#figures-behind-the-code)."""
    if len({d.process_index for d in mesh.devices.flat}) > 1:
        return _psum_flat
    return functools.partial(jax.lax.psum, axis_name=AXIS)


def _psum_flat(values: list) -> list:
    """``jax.lax.psum(values, AXIS)`` as one all-reduce per dtype (one in all, for float32
    gradients): the arrays raveled into one buffer, summed, cut back."""
    out: list = [None] * len(values)
    by_dtype: dict = {}
    for i, v in enumerate(values):
        by_dtype.setdefault(jnp.dtype(v.dtype), []).append(i)
    for indices in by_dtype.values():
        flat = jax.lax.psum(jnp.concatenate([values[i].ravel() for i in indices]), AXIS)
        at = 0
        for i in indices:
            size = values[i].size
            out[i] = flat[at : at + size].reshape(values[i].shape)
            at += size
    return out


def _has_convolution(closed) -> bool:
    """Whether a (closed) jaxpr, or one nested in it, holds a convolution."""
    jaxpr = getattr(closed, "jaxpr", closed)
    for eqn in jaxpr.eqns:
        if eqn.primitive.name.startswith("conv_general_dilated"):
            return True
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                if hasattr(getattr(sub, "jaxpr", sub), "eqns") and _has_convolution(sub):
                    return True
    return False


def stacked(values: Sequence, replicas: int) -> list:
    """Per-device copies of ``values`` (host arrays), stacked along a first axis."""
    return [np.broadcast_to(np.asarray(v), (replicas, *np.shape(v))).copy() for v in values]


__all__ = ["all_reduce", "stacked"]
