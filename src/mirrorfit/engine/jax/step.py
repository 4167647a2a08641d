"""What runs on the devices under JAX, compiled once per run.

Per replica (a ``shard_map`` over the mesh's ``"data"`` axis, ``check_vma=False``):
``stateless_call``, the loss divided by the *global* batch, ``value_and_grad`` over K
micro-batches summed locally, **one** all-reduce of all gradients per optimizer step, and
``stateless_apply``. :func:`build_steps` returns ``train(state, xs, ys, n)`` (``n`` steps,
state donated) and ``evaluate(...)`` (a block of batches, padding masked out).
(why: docs/jax.md#what-it-does, docs/architecture.md#jax-the-step)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from mirrorfit.engine.jax import layer_gather
from mirrorfit.engine.jax.placement import AXIS


class State(NamedTuple):
    """The training state as arrays. ``trainable`` and ``optimizer`` are replicated on every
    device; ``non_trainable`` (batch-norm statistics, RNG seeds) and ``metrics`` are kept per
    device, stacked along a first axis of the mesh's size (each device updates its own from
    its own examples; read back as the mean, or the sum for metrics)."""

    trainable: list
    non_trainable: list
    optimizer: list
    metrics: list


def as_float(x):
    """Pixels as the model takes them: uint8 scaled to [0, 1], other types cast to float32
    (what the TensorFlow pipeline's ``finish`` does, done here on the device)."""
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


@dataclass(frozen=True)
class Metrics:
    """Keras metric objects updated statelessly: the loss (a Mean of per-example losses) and
    the run's metrics, their variables concatenated in one list (``slices`` per metric)."""

    objects: tuple  # (loss Mean, *metrics)

    @property
    def variables(self) -> list:
        return [v for m in self.objects for v in m.variables]

    def update(self, values: list, per_example, y, y_pred, weight=None) -> list:
        out, at = [], 0
        for i, metric in enumerate(self.objects):
            n = len(metric.variables)
            mine = values[at : at + n]
            at += n
            args = (per_example,) if i == 0 else (y, y_pred)
            out.extend(metric.stateless_update_state(mine, *args, sample_weight=weight))
        return out


@dataclass(frozen=True)
class Steps:
    """The compiled calls of one run (see the module's docstring)."""

    train: Callable
    evaluate: Callable
    traces: list  # one entry per trace of ``train``: stays [1] while running


@dataclass(frozen=True)
class Spec:
    """What the compiled calls of one run are built from. ``global_batch``: examples per
    optimizer step over all replicas and micro-batches (the loss's divisor); ``layout``: the
    state's split over the mesh (:mod:`mirrorfit.engine.jax.sharding`; None: replicated)."""

    model: object
    optimizer: object
    loss: object
    train_metrics: Metrics
    eval_metrics: Metrics
    mesh: object
    global_batch: int
    accum_steps: int
    loss_scaling: bool
    layout: object = None

    @property
    def replicas(self) -> int:
        return self.mesh.size

    @property
    def stored_sharded(self) -> bool:
        """Whether the weights are kept split between steps (``--shard all``)."""
        return self.layout is not None and self.layout.mode == "all"

    @property
    def psum(self) -> Callable:
        return all_reduce(self.mesh)


def per_example_loss(spec: Spec, y, y_pred):
    """The loss of each example, in float32."""
    loss = spec.loss
    values = (
        loss.call(y, y_pred.astype(jnp.float32))
        if hasattr(loss, "call")
        else loss(y, y_pred.astype(jnp.float32))
    )
    return values.astype(jnp.float32)


def compute_loss_and_updates(
    spec: Spec, trainable, non_trainable, metrics, optimizer_vars, x, y, stored=None
):
    """One micro-batch's loss on this device, summed and divided by the global batch (plus
    regularisers, once per optimizer step), and the updated statistics and metrics.
    ``stored``: the split weights under ``--shard all`` (gathered layer by layer)."""
    with layer_gather.weights(spec.layout, trainable, stored) as values:
        y_pred, non_trainable, losses = spec.model.stateless_call(
            values, non_trainable, x, training=True, return_losses=True
        )
    per_example = per_example_loss(spec, y, y_pred)
    value = jnp.sum(per_example) / spec.global_batch
    if losses:  # regularisers: once per optimizer step over all replicas
        value = value + sum(losses) / (spec.replicas * spec.accum_steps)
    metrics = spec.train_metrics.update(metrics, per_example, y, y_pred)
    if spec.loss_scaling:
        from keras.src.backend import StatelessScope

        applies = spec.optimizer if spec.layout is None else spec.layout.local_optimizer
        with StatelessScope(state_mapping=list(zip(applies.variables, optimizer_vars))):
            value = applies.scale_loss(value)
    return value, (non_trainable, metrics)


def gradients(
    spec: Spec, trainable, non_trainable, metrics, optimizer_vars, x, y, stored, *, unrolled: bool
):
    """This device's gradients summed over its K micro-batches of ``x``, ``y`` (in a loop,
    or ``unrolled``), with the statistics and metrics they updated."""
    k = spec.accum_steps
    grad = jax.value_and_grad(functools.partial(compute_loss_and_updates, spec), has_aux=True)
    xk = x.reshape((k, -1) + x.shape[1:])
    yk = y.reshape((k, -1) + y.shape[1:])

    def micro(j, acc):
        total, non_trainable, metrics = acc
        (_, (non_trainable, metrics)), g = grad(
            trainable, non_trainable, metrics, optimizer_vars, xk[j], yk[j], stored
        )
        return [t + d for t, d in zip(total, g)], non_trainable, metrics

    acc = ([jnp.zeros_like(t) for t in trainable], non_trainable, metrics)
    if k == 1 or unrolled:
        for j in range(k):
            acc = micro(j, acc)
        return acc
    return jax.lax.fori_loop(0, k, micro, acc)


def apply_gradients(spec: Spec, grads, trainable, stored, optimizer_vars):
    """The optimizer step with this device's summed gradients: one all-reduce, or (sharded)
    a reduce-scatter and each device's update of its slices. Returns what the state stores:
    ``(weights, optimizer variables)``."""
    layout = spec.layout
    if layout is None:
        return spec.optimizer.stateless_apply(optimizer_vars, spec.psum(grads), trainable)
    grads = layout.reduced(grads, spec.psum)
    if spec.loss_scaling:
        grads = layout.all_finite(grads)
    mine = stored if spec.stored_sharded else layout.local(trainable)
    mine, optimizer_vars = layout.local_optimizer.stateless_apply(optimizer_vars, grads, mine)
    return (mine if spec.stored_sharded else layout.gathered(mine)), optimizer_vars


def train_step(spec: Spec, carry, x, y, *, unrolled: bool = False):
    """One optimizer step on this device's share of a global batch: ``carry`` is
    ``(weights as stored, statistics, optimizer variables, metrics)``."""
    stored, non_trainable, optimizer_vars, metrics = carry
    trainable = spec.layout.step_weights(stored) if spec.stored_sharded else stored
    grads, non_trainable, metrics = gradients(
        spec,
        trainable,
        non_trainable,
        metrics,
        optimizer_vars,
        as_float(x),
        y,
        stored if spec.stored_sharded else None,
        unrolled=unrolled,
    )
    stored, optimizer_vars = apply_gradients(spec, grads, trainable, stored, optimizer_vars)
    return stored, non_trainable, optimizer_vars, metrics


def train_steps(spec: Spec, state: State, xs, ys, num_steps, *, one_by_one: bool = False):
    """Per device: ``num_steps`` steps over the batches ``xs[i % L]`` in a loop; with
    ``one_by_one``, the one step ``num_steps`` (its index in the block), unrolled."""
    carry = (
        state.trainable,
        [a[0] for a in state.non_trainable],
        state.optimizer,
        [a[0] for a in state.metrics],
    )
    held = xs.shape[0]

    def step(i, carry):
        return train_step(spec, carry, xs[i % held], ys[i % held], unrolled=one_by_one)

    carry = step(num_steps, carry) if one_by_one else jax.lax.fori_loop(0, num_steps, step, carry)
    trainable, non_trainable, optimizer_vars, metrics = carry
    return State(
        trainable, [a[None] for a in non_trainable], optimizer_vars, [a[None] for a in metrics]
    )


def eval_steps(spec: Spec, trainable, non_trainable, metrics, xs, ys, weights, num_batches):
    """Per device: the eval metrics over ``num_batches`` batches, padding weighted 0."""
    metrics = [a[0] for a in metrics]

    def one_batch(i, metrics):
        y_pred, _ = spec.model.stateless_call(
            trainable, non_trainable, as_float(xs[i]), training=False
        )
        per_example = per_example_loss(spec, ys[i], y_pred)
        return spec.eval_metrics.update(metrics, per_example, ys[i], y_pred, weights[i])

    metrics = jax.lax.fori_loop(0, num_batches, one_batch, metrics)
    return [a[None] for a in metrics]


def build_steps(**settings) -> Steps:
    """The compiled train and eval calls of a run (``settings``: :class:`Spec`'s fields)."""
    spec = Spec(**settings)
    traces: list[int] = []
    specs = State(P(), P(AXIS), P(), P(AXIS))
    if spec.layout is not None:
        specs = State(
            spec.layout.trainable_specs(), P(AXIS), spec.layout.optimizer_specs(), P(AXIS)
        )

    def over_mesh(per_device):
        return jax.shard_map(
            per_device,
            mesh=spec.mesh,
            in_specs=(specs, P(None, AXIS), P(None, AXIS), P()),
            out_specs=specs,
            check_vma=False,
        )  # see the module's docstring

    def train(state, xs, ys, num_steps):
        traces.append(1)  # runs while tracing only
        return over_mesh(functools.partial(train_steps, spec))(state, xs, ys, num_steps)

    def train_one(state, xs, ys, at):
        traces.append(1)
        return over_mesh(functools.partial(train_steps, spec, one_by_one=True))(state, xs, ys, at)

    evaluate = jax.shard_map(
        functools.partial(eval_steps, spec),
        mesh=spec.mesh,
        in_specs=(P(), P(), P(AXIS), P(None, AXIS), P(None, AXIS), P(None, AXIS), P()),
        out_specs=P(AXIS),
        check_vma=False,
    )
    one_by_one = None
    if spec.mesh.devices.flat[0].platform == "cpu":
        one_by_one = functools.partial(_convolves, spec)
    return Steps(
        train=_Train(
            jax.jit(train, donate_argnums=(0,)), jax.jit(train_one, donate_argnums=(0,)), one_by_one
        ),
        evaluate=jax.jit(evaluate, donate_argnums=(2,)),
        traces=traces,
    )


def _convolves(spec: Spec, state, xs) -> bool:
    """Whether the model's forward pass holds a convolution (see :class:`_Train`)."""
    x = jax.ShapeDtypeStruct((max(1, xs.shape[1] // spec.replicas), *xs.shape[2:]), jnp.float32)
    shapes = [
        [jax.ShapeDtypeStruct(a.shape[skip:], a.dtype) for a in group]
        for group, skip in ((state.trainable, 0), (state.non_trainable, 1))
    ]
    return _has_convolution(
        jax.make_jaxpr(lambda t, n, x: spec.model.stateless_call(t, n, x, training=True)[0])(
            *shapes, x
        )
    )


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
    import numpy as np

    return [np.broadcast_to(np.asarray(v), (replicas, *np.shape(v))).copy() for v in values]


__all__ = [
    "State",
    "Metrics",
    "Steps",
    "Spec",
    "build_steps",
    "compute_loss_and_updates",
    "gradients",
    "apply_gradients",
    "train_step",
    "train_steps",
    "eval_steps",
    "stacked",
    "as_float",
]
