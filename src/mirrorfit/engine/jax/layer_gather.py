"""Layer-by-layer gathering under ``--shard all`` (the FSDP schedule): a split weight is
all-gathered where its layer runs, forward and again backward, so a device holds about one
layer's whole weights at a time. :func:`prepare` wraps the layers, :func:`mapped` maps the
variables to ``gather(shard) + probe``, :func:`gathering` runs the wrapped layers as
``jax.custom_vjp`` functions. (how and why: docs/architecture.md#jax-layer-by-layer-gathering)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import jax
import jax.numpy as jnp

from mirrorfit.engine.jax.placement import AXIS
from mirrorfit.models.remat import stateless_keras_layer

# The split weights of the trace being built: {id(variable): (shard, axis, probe)} (a frozen
# weight's probe None: it takes no gradient); None outside a step.
_SHARDS: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "mirrorfit_shards", default=None
)


def prepare(model, variables, axes, frozen=()) -> int:
    """Wrap the ``call`` of each qualifying layer of ``model`` that holds one of
    ``variables`` split along ``axes`` (None: replicated). ``frozen``: the non-trainable
    variables a step never writes (a LoRA layer's kernel), which a qualifying layer may
    hold. Returns how many layers."""
    split = {id(v) for v, a in zip(variables, axes) if a is not None}
    fixed = {id(v) for v in frozen}
    count = 0
    for layer in _called_by_models(model):
        if _qualifies(layer, fixed) and any(id(v) in split for v in layer.variables):
            if not getattr(layer.call, "_mirrorfit_gathers", False):
                layer.call = _gathered_call(layer, layer.call)
            count += 1
    return count


def _qualifies(layer, frozen: set) -> bool:
    """One of Keras's own layers with no sublayers whose call writes nothing of its own."""
    if stateless_keras_layer(layer):
        return True
    return (
        type(layer).__module__.startswith("keras.")
        and not any(True for _ in layer._flatten_layers(include_self=False, recursive=False))
        and all(id(v) in frozen for v in layer.non_trainable_variables)
    )


def _called_by_models(model):
    """The layers a model (``model`` or a model nested in it) calls itself. Not the layers
    inside other layers: an RNN's cell runs once per time step, and would gather as often."""
    import keras

    for layer in model._flatten_layers(include_self=False, recursive=False):
        if isinstance(layer, keras.Model):
            yield from _called_by_models(layer)
        else:
            yield layer


def mapped(shards, probes, axes) -> list:
    """What the model's trainable variables are mapped to: split ones ``gather(shard) +
    probe`` (the gradient flows to the probe), replicated ones ``probe`` itself (their
    value)."""
    return [
        p if a is None else _gather(jax.lax.stop_gradient(s), a) + p
        for s, p, a in zip(shards, probes, axes)
    ]


def probes(shards, axes, replicas: int) -> list:
    """Zeros of each split variable's whole shape; the replicated values as they are."""
    return [
        s
        if a is None
        else jnp.zeros((*s.shape[:a], s.shape[a] * replicas, *s.shape[a + 1 :]), s.dtype)
        for s, a in zip(shards, axes)
    ]


@contextlib.contextmanager
def gathering(variables, shards, axes, probes, frozen=()):
    """Within: wrapped layers gather ``variables``' split values from ``shards``, their
    gradients taken for ``probes``; and ``frozen`` ``(variable, shard, axis)``'s, which
    take none."""
    held = {
        id(v): (s, a, p) for v, s, a, p in zip(variables, shards, axes, probes) if a is not None
    }
    held.update((id(v), (s, a, None)) for v, s, a in frozen)
    token = _SHARDS.set(held)
    try:
        yield
    finally:
        _SHARDS.reset(token)


@contextlib.contextmanager
def weights(layout, weights, shards, frozen=()):
    """The values to map the model's trainable variables to in a step's forward pass, with
    the wrapped layers gathering inside (``frozen``: split frozen weights, ``(variable,
    shard, axis)``, gathered there too). ``shards`` None (weights stored whole): ``weights``
    as they are; else ``weights`` are :func:`probes`."""
    if shards is None:
        with gathering((), (), (), (), frozen) if frozen else contextlib.nullcontext():
            yield weights
        return
    with gathering(layout.variables, shards, layout.trainable, weights, frozen):
        yield mapped(shards, weights, layout.trainable)


def _gather(shard, axis: int):
    return jax.lax.all_gather(shard, AXIS, axis=axis, tiled=True)


def _zero_after(anchor):
    """An unsigned zero computed from one element of ``anchor`` (any array), which XLA does
    not fold: what follows it cannot run before ``anchor`` exists. Exact for every value,
    NaN and infinities included."""
    first = jnp.ravel(jax.tree.leaves(anchor)[0])[:1]
    if jnp.issubdtype(first.dtype, jnp.floating):
        bits = jax.lax.bitcast_convert_type(
            first, {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[first.dtype.itemsize]
        )
    else:
        bits = first
    bits = bits.astype(jnp.uint32)
    return jax.lax.shift_right_logical(
        jax.lax.shift_right_logical(bits, jnp.uint32(16)), jnp.uint32(16)
    )[0]


def _gather_after(shard, axis: int, anchor):
    return _gather(shard - _zero_after(anchor).astype(shard.dtype), axis)


def _gathered_call(layer, call):
    """``layer.call`` that gathers its split weights itself, forward and backward (see the
    module's docstring); outside a step, or given array keyword arguments, ``call`` as is."""
    from keras.src.backend import StatelessScope, get_autocast_scope, get_stateless_scope

    @functools.wraps(call)
    def gathers(*args, **kwargs):
        shards, scope = _SHARDS.get(), get_stateless_scope()
        variables = list(layer.trainable_variables)
        fixed = list(layer.non_trainable_variables)  # frozen: _qualifies
        if (
            shards is None
            or scope is None
            or not args
            or any(isinstance(v, jax.Array) for v in jax.tree.leaves(kwargs))
        ):
            return call(*args, **kwargs)
        split = [shards.get(id(v)) for v in variables]
        # the split weights' probes, what their gradients (of any order) are taken for
        values = [
            scope.get_current_value(v) if s is None else s[2] for v, s in zip(variables, split)
        ]
        if any(v is None for v in values):
            return call(*args, **kwargs)
        fixed_split = [shards.get(id(v)) for v in fixed]
        fixed_pieces = [
            scope.get_current_value(v) if s is None else s[0] for v, s in zip(fixed, fixed_split)
        ]
        if any(v is None for v in fixed_pieces):
            return call(*args, **kwargs)
        autocast = get_autocast_scope()

        def run(weights, fixed_values, inputs):
            mapping = list(zip([*variables, *fixed], [*weights, *fixed_values]))
            with StatelessScope(state_mapping=mapping):
                if autocast is None:
                    return call(*inputs, **kwargs)
                with type(autocast)(autocast.dtype):
                    return call(*inputs, **kwargs)

        def whole(weights, pieces, anchor):  # a split one's weight is its probe, zeros
            return [
                w if s is None else _gather_after(piece, s[1], anchor) + w
                for w, piece, s in zip(weights, pieces, split)
            ]

        def whole_fixed(pieces, anchor):  # the frozen ones: no probe, no gradient
            return [
                p if s is None else _gather_after(p, s[1], anchor)
                for p, s in zip(pieces, fixed_split)
            ]

        # The shards are arguments, not closed over: the backward rule of a layer called in
        # a loop or a branch (keras.ops.fori_loop, cond) runs outside the trace they belong to.
        @jax.custom_vjp
        def apply(weights, pieces, fixed_pieces, inputs):
            return run(whole(weights, pieces, inputs), whole_fixed(fixed_pieces, inputs), inputs)

        def forward(weights, pieces, fixed_pieces, inputs):
            # the split weights' gathered values are not kept for the backward pass, which
            # gathers them again from the shards (their probes are kept too: zeros XLA never
            # writes out)
            saved = (weights, pieces, fixed_pieces, inputs)
            return apply(weights, pieces, fixed_pieces, inputs), saved

        def backward(saved, cotangent):
            weights, pieces, fixed_pieces, inputs = saved
            full = whole(weights, pieces, cotangent)
            fixed_full = whole_fixed(fixed_pieces, cotangent)
            floats = [
                jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact) for x in jax.tree.leaves(inputs)
            ]
            _, vjp = jax.vjp(lambda w, i: run(w, fixed_full, i), full, inputs)
            weight_grads, input_grads = vjp(cotangent)
            leaves, tree = jax.tree.flatten(input_grads)
            leaves = [g if f else None for g, f in zip(leaves, floats)]
            # no gradient for the shards: the probes carry the split weights' gradients
            nothing = [None] * len(pieces), [None] * len(fixed_pieces)
            return weight_grads, *nothing, jax.tree.unflatten(tree, leaves)

        apply.defvjp(forward, backward)
        pieces = [None if s is None else s[0] for s in split]
        return apply(values, pieces, fixed_pieces, args)

    gathers._mirrorfit_gathers = True  # applied once, however often it is asked
    return gathers


__all__ = ["prepare", "mapped", "probes", "gathering", "weights"]
