"""Sharded training state on the JAX engine (``--shard``): which arrays are split over the
mesh, along which axis, and the collectives of a sharded step.

- ``none``: every device holds the whole state (replicated data parallel).
- ``optimizer`` (ZeRO-1/2): gradients reduce-scattered, each device updates its slice of the
  weights with its slice of the optimizer state, the weights all-gathered after.
- ``all`` (ZeRO-3/FSDP): the weights stored sharded too, each layer gathering its own
  (:mod:`mirrorfit.engine.jax.layer_gather`).

Which arrays: :func:`shard_axis`; which optimizers: :data:`ELEMENTWISE`, no norm clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from mirrorfit.engine.backends import SHARD_MODES, check_settings
from mirrorfit.engine.jax.placement import AXIS
from mirrorfit.errors import ConfigError

MIN_ELEMENTS = 1024  # values: a smaller parameter stays replicated (its collectives cost more)
# Keras optimizers whose update of each value reads only that value's gradient and state, so a
# slice of the weights updates as the whole would. Adafactor (factored rows and columns), Lamb
# (a trust ratio per tensor) and Muon (orthogonalised matrices) read whole tensors.
ELEMENTWISE = (
    "SGD",
    "Adam",
    "AdamW",
    "Adamax",
    "Nadam",
    "RMSprop",
    "Adagrad",
    "Adadelta",
    "Lion",
    "Ftrl",
)


def check_mode(shard: str) -> str:
    check_settings("jax", shard=shard)
    return shard


def shard_axis(shape: Sequence[int], replicas: int, *, constrained: bool = False) -> int | None:
    """The axis a parameter of ``shape`` is split along over ``replicas`` devices; None:
    replicated (the rule: docs/jax.md#sharded-state---shard).
    """
    if replicas == 1 or constrained or math.prod(shape) < MIN_ELEMENTS:
        return None
    return next((d for d, n in enumerate(shape) if n % replicas == 0), None)


def check_optimizer(optimizer) -> None:
    """ConfigError, one line, for an optimizer a slice of the weights cannot be updated with."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # fp16's LossScaleOptimizer
    name = type(inner).__name__
    if name not in ELEMENTWISE or type(inner).__module__.split(".")[0] != "keras":
        raise ConfigError(
            f"--shard cannot split the state of optimizer {name}: it takes Keras's "
            f"own optimizers that update each value alone ({', '.join(ELEMENTWISE)})"
            "; use one of them, or --shard none"
        )
    for clip in ("clipnorm", "global_clipnorm"):
        if getattr(inner, clip, None) is not None:
            raise ConfigError(
                f"--shard: the optimizer's {clip} reads the norm of whole "
                "gradients, which no device holds; use clipvalue, or --shard none"
            )


@dataclass(frozen=True)
class Layout:
    """How one run's state is split. ``trainable`` and ``optimizer``: per variable, the axis
    it is split along (None: replicated); ``local_optimizer``: a copy of the run's optimizer
    built on the shapes one device holds (what the step applies)."""

    mode: str
    replicas: int
    trainable: tuple
    optimizer: tuple
    local_optimizer: object
    variables: tuple = field(default=(), compare=False, repr=False)  # the model's trainable
    gathered_layers: int = 0  # under ``all``: layers gathering their own weights

    @property
    def sharded(self) -> bool:
        return any(a is not None for a in self.trainable)

    def specs(self, axes) -> list:
        from jax.sharding import PartitionSpec as P

        return [P() if a is None else P(*([None] * a), AXIS) for a in axes]

    def trainable_specs(self) -> list:
        return self.specs(self.trainable if self.mode == "all" else [None] * len(self.trainable))

    def optimizer_specs(self) -> list:
        return self.specs(self.optimizer)

    def describe(self) -> str:
        n = sum(a is not None for a in self.trainable)
        what = {
            "optimizer": "the optimizer state (ZeRO-1)",
            "all": "the weights and the optimizer state (FSDP)",
        }[self.mode]
        n_layers = self.gathered_layers
        gathered = (
            ""
            if self.mode != "all"
            else (
                f"; gathered layer by layer in {n_layers} layer{'s' * (n_layers != 1)}"
                if n_layers
                else "; gathered whole for each step (no layer gathers its own)"
            )
        )
        return (
            f"{what} split over {self.replicas} devices: {n} of {len(self.trainable)} "
            f"parameters (those of {MIN_ELEMENTS}+ values, with an axis that divides, "
            f"without a constraint){gathered}"
        )

    # -- inside the step (per device, in a shard_map over AXIS) ---------------------------------
    def step_weights(self, stored: list) -> list:
        """What a step takes the gradient for: under ``all``, zeros of each split weight's
        whole shape (engine/jax/layer_gather.py gathers the weights layer by layer); else the
        whole weights ``stored``."""
        from mirrorfit.engine.jax.layer_gather import probes

        return probes(stored, self.trainable, self.replicas) if self.mode == "all" else stored

    def gathered(self, values: list) -> list:
        """Each device's slices as the whole arrays (all-gathers)."""
        import jax

        return [
            v if a is None else jax.lax.all_gather(v, AXIS, axis=a, tiled=True)
            for v, a in zip(values, self.trainable)
        ]

    def reduced(self, grads: list, psum) -> list:
        """The gradients summed over the devices: split ones reduce-scattered (each device
        gets its slice), replicated ones all-reduced with ``psum``."""
        import jax

        replicated = [g for g, a in zip(grads, self.trainable) if a is None]
        summed = iter(psum(replicated) if replicated else [])
        return [
            next(summed)
            if a is None
            else jax.lax.psum_scatter(g, AXIS, scatter_dimension=a, tiled=True)
            for g, a in zip(grads, self.trainable)
        ]

    def local(self, values: list) -> list:
        """This device's slices of whole arrays (the split ones)."""
        import jax

        index = jax.lax.axis_index(AXIS)
        return [
            v
            if a is None
            else jax.lax.dynamic_slice_in_dim(
                v, index * (v.shape[a] // self.replicas), v.shape[a] // self.replicas, a
            )
            for v, a in zip(values, self.trainable)
        ]

    def whole_stand_ins(self, optimizer_values: list) -> list:
        """The optimizer's variables as Keras's ``compute_loss_and_updates`` maps them (whole
        shapes, for fp16's loss scale): the replicated ones as they are, the split ones as
        zeros, which nothing reads and the compiler drops."""
        import jax.numpy as jnp

        return [
            v
            if a is None
            else jnp.zeros((*v.shape[:a], v.shape[a] * self.replicas, *v.shape[a + 1 :]), v.dtype)
            for v, a in zip(optimizer_values, self.optimizer)
        ]

    def all_finite(self, grads: list) -> list:
        """fp16: the gradients, or NaN everywhere where any device's slice is non-finite, so
        that every device's loss-scale optimizer skips the same steps."""
        import jax
        import jax.numpy as jnp

        bad = sum(jnp.sum(~jnp.isfinite(g)).astype(jnp.int32) for g in grads)
        finite = jax.lax.psum(bad, AXIS) == 0
        return [jnp.where(finite, g, jnp.nan).astype(g.dtype) for g in grads]


def build_layout(mode: str, model, optimizer, replicas: int) -> Layout | None:
    """The layout of ``model``'s trainable variables and the built ``optimizer``'s over
    ``replicas`` devices; None for ``none``, or where nothing is large enough to split."""
    check_mode(mode)
    if mode == "none":
        return None
    check_optimizer(optimizer)
    import keras

    variables = list(model.trainable_variables)
    axes = tuple(
        shard_axis(v.shape, replicas, constrained=v.constraint is not None) for v in variables
    )
    if all(a is None for a in axes):
        return None
    try:  # the copy the slices are updated with: the same class and settings
        config = optimizer.get_config()
        rate = getattr(optimizer, "_learning_rate", None)
        if "learning_rate" in config and callable(rate):  # a schedule or function: itself
            config["learning_rate"] = rate
        local = type(optimizer).from_config(config)
    except Exception as e:  # noqa: BLE001 - a learning rate Keras cannot save and load
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:200]
        raise ConfigError(
            f"--shard copies the optimizer for each device's slices through its "
            f"config, and {type(optimizer).__name__}'s failed ({first}); give the "
            "learning-rate schedule a get_config and register it with "
            "keras.saving.register_keras_serializable, or use --shard none"
        ) from None
    placeholders = []
    for v, a in zip(variables, axes):
        shape = list(v.shape)
        if a is not None:
            shape[a] //= replicas
        p = keras.Variable(keras.ops.zeros(shape, v.dtype), dtype=v.dtype, name=v.name)
        p.constraint = v.constraint
        p.overwrite_with_gradient = v.overwrite_with_gradient
        placeholders.append(p)
    # What the config does not hold: the variables excluded from weight decay (by list or by
    # name), decided on the run's optimizer and given to the copy as its stand-ins.
    whole = getattr(optimizer, "inner_optimizer", optimizer)
    getattr(local, "inner_optimizer", local).exclude_from_weight_decay(
        var_list=[p for v, p in zip(variables, placeholders) if not whole._use_weight_decay(v)]
    )
    local.build(placeholders)
    if len(local.variables) != len(optimizer.variables):
        raise ConfigError(
            f"--shard: optimizer {type(optimizer).__name__} made "
            f"{len(local.variables)} variables for the slices and "
            f"{len(optimizer.variables)} for the whole; use --shard none"
        )
    # The copy only ever runs stateless (every variable mapped to the step's values): the
    # buffers its build made, a slice of every weight and its slots, would be held for nothing.
    for v in [*placeholders, *local.variables]:
        if v.ndim and hasattr(v.value, "delete"):  # a JAX array (a test may build on TF)
            v.value.delete()
    gathered = 0
    if mode == "all":
        from mirrorfit.engine.jax.layer_gather import prepare

        gathered = prepare(model, variables, axes)
    return Layout(
        mode=mode,
        replicas=replicas,
        trainable=axes,
        optimizer=tuple(
            _split_axis(whole.shape, part.shape, replicas)
            for whole, part in zip(optimizer.variables, local.variables)
        ),
        local_optimizer=local,
        variables=tuple(variables),
        gathered_layers=gathered,
    )


def _split_axis(whole, part, replicas: int) -> int | None:
    """The axis along which ``part`` is ``whole`` split ``replicas`` ways; None: the same."""
    if tuple(whole) == tuple(part):
        return None
    differ = [d for d, (w, p) in enumerate(zip(whole, part)) if w != p]
    if (
        len(whole) != len(part)
        or len(differ) != 1
        or part[differ[0]] * replicas != whole[differ[0]]
    ):
        raise ConfigError(
            f"--shard: an optimizer variable of shape {list(whole)} became "
            f"{list(part)} for a slice; use --shard none"
        )
    return differ[0]


def describe_unsplit(mode: str, replicas: int) -> str:
    """Why a run's state is whole on every device, in a few words."""
    if mode == "none":
        return "replicated (--shard none)"
    if replicas == 1:
        return f"replicated: --shard {mode} on one device has nothing to split"
    return (
        f"replicated: under --shard {mode} no parameter splits over {replicas} devices "
        f"(each has under {MIN_ELEMENTS} values, no axis {replicas} divides, or a "
        "constraint)"
    )


def state_bytes_per_device(arrays: Sequence) -> int:
    """The most bytes of ``arrays`` (JAX arrays) any one of this process's devices holds,
    read from their shards, each buffer once (two arrays over one buffer: a variable and the
    state it was read from)."""
    held: dict = {}
    for array in arrays:
        for shard in array.addressable_shards:
            held[(shard.device, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
    per_device: dict = {}
    for (device, _), size in held.items():
        per_device[device] = per_device.get(device, 0) + size
    return max(per_device.values(), default=0)


def distinct_arrays(*groups: list) -> list[list]:
    """``groups`` of arrays with each one that appeared before (the same object) replaced by a
    copy: two Keras variables may hold one array (``b.assign(a)``), and a buffer donated twice
    crashes XLA (Keras's own fit refuses it: "donate the same buffer twice")."""
    import jax.numpy as jnp

    seen: set = set()
    out = []
    for group in groups:
        kept = []
        for value in group:
            if id(value) in seen:
                value = jnp.array(value, copy=True)
            seen.add(id(value))
            kept.append(value)
        out.append(kept)
    return out


def held_by_model(model) -> list:
    """The arrays of the model's own Keras variables (weights, statistics, metrics) and of its
    optimizer's, where they live between calls (whole on a device, or on their shards)."""
    import jax

    optimizer = getattr(model, "optimizer", None)
    variables = [*model.variables, *(optimizer.variables if optimizer is not None else [])]
    return [v.value for v in variables if isinstance(v.value, jax.Array)]


def peak_device_bytes(devices) -> int | None:
    """The largest peak memory in use any of ``devices`` reports (GPUs), else None."""
    peaks = []
    for device in devices:
        try:
            stats = device.memory_stats() or {}
        except Exception:  # noqa: BLE001 - a platform without the statistics (CPU)
            stats = {}
        if "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


__all__ = [
    "SHARD_MODES",
    "MIN_ELEMENTS",
    "ELEMENTWISE",
    "Layout",
    "build_layout",
    "check_mode",
    "describe_unsplit",
    "shard_axis",
    "check_optimizer",
    "state_bytes_per_device",
    "held_by_model",
    "peak_device_bytes",
]
