"""The JAX engine for ``mirrorfit.fit``: a compiled Keras model trained as it was compiled. Per
replica (``shard_map`` over the mesh's ``"data"`` axis): Keras's ``compute_loss_and_updates``
on its share, divided by replicas x micro-batches; the K micro-batches' gradients summed, one
``psum`` per step, the optimizer's ``stateless_apply``. Metrics per replica
(:mod:`mirrorfit.fitting.metrics`), merged when read. A model's own ``train_step`` or
``test_step`` runs over the global batch instead (:mod:`~mirrorfit.engine.jax.keras_override`).
(why, and several workers: docs/architecture.md#the-engines-under-fit)
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mirrorfit.engine.jax import layer_gather
from mirrorfit.engine.jax.keras_override import OverrideRunner, runs_whole
from mirrorfit.engine.jax.keras_override import check as check_override
from mirrorfit.engine.jax.placement import AXIS
from mirrorfit.engine.jax.sharding import (
    build_layout,
    describe_unsplit,
    distinct_arrays,
    held_by_model,
    peak_device_bytes,
    shard_axis,
    state_bytes_per_device,
)
from mirrorfit.engine.jax.step import _has_convolution, _Train, all_reduce, stacked
from mirrorfit.errors import ConfigError, FitError
from mirrorfit.fitting import batchnorm
from mirrorfit.fitting import metrics as fit_metrics


class State(NamedTuple):
    trainable: list  # replicated
    non_trainable: list  # the statistics a step writes: per device (stacked on a first axis)
    optimizer: list  # replicated
    metrics: list  # per device


# The Keras data adapters epoch 1 reads anew after the first batch built the model, as Keras's
# JAX fit does (its EpochIterator.reset()): a shuffle is drawn again, the epochs in its orders.
READ_AGAIN = frozenset({"ArrayDataAdapter", "TFDatasetAdapter", "PyDatasetAdapter"})


def check_model(model, placement=None, distribution=None) -> None:
    """FitError (a ValueError) for what this engine cannot run the model with."""
    if runs_whole(model):
        check_override(model, placement, distribution)


def placement(model, chosen=None):
    """The mesh of ``mirrorfit.setup`` (``chosen``), else one over every local device."""
    if chosen is not None:
        return chosen.placement
    from mirrorfit.engine.jax.devices import configure_devices
    from mirrorfit.engine.jax.placement import build_placement

    return build_placement(configure_devices())


def replicas(placement) -> int:
    """The groups a batch is split over: every device, or each data group of a 2-D mesh."""
    return placement.data_parallel


def pads(model, step: str, placement=None, accum_steps: int = 1) -> bool:
    """Whether ``step`` batches are padded: not where the step runs over the global batch
    as the data gave it (:func:`_whole_batch`)."""
    return not _whole_batch(model, placement, accum_steps)


def runner(model, placement, *, sample=None, **settings):
    """The runner for ``model``: mirrorfit's per-replica step, or the model's own over the
    global batch (:mod:`mirrorfit.engine.jax.keras_override`, :func:`_whole_batch`).
    ``sample``: the first batch's inputs, which tell the frozen weights (:func:`frozen`)."""
    if _whole_batch(model, placement, settings.get("accum_steps", 1)):
        return OverrideRunner(model, placement, **settings)
    return Runner(model, placement, sample=sample, **settings)


def ready(value) -> None:
    """Wait for arrays put on the devices (JAX puts them asynchronously)."""
    jax.block_until_ready(value)


def checkpoint_state(runner):
    """``checkpoint_dir``'s reader of an Orbax state, and its writer where ``runner`` splits
    the state (:class:`~mirrorfit.engine.jax.fit_state.FitState`); None for a model's own
    step (whole: Keras's ``save_weights``)."""
    from mirrorfit.engine.jax.fit_state import FitState

    return FitState(runner) if isinstance(runner, Runner) else None


def frozen(model, sample, replicas: int) -> list[bool]:
    """Per non-trainable variable of ``model``: whether a training step leaves it as it is (a
    frozen layer's weights, a LoRA layer's kernel) rather than writing it (batch norm's
    moving statistics, a dropout's seed), read from one trace of the model's forward pass
    on ``sample``'s shapes (each replica's share). All False where it cannot be traced: each
    device then keeps them as statistics, as before."""
    variables = model.non_trainable_variables
    if sample is None or not variables:
        return [False] * len(variables)

    def spec(a):
        a = np.asarray(a) if not hasattr(a, "dtype") else a
        return jax.ShapeDtypeStruct((max(1, a.shape[0] // replicas), *a.shape[1:]), a.dtype)

    kwargs = {"training": True} if model._call_has_training_arg else {}
    try:
        closed = jax.make_jaxpr(lambda t, n, x: model.stateless_call(t, n, x, **kwargs)[1])(
            [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.trainable_variables],
            [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in variables],
            jax.tree.map(spec, sample),
        )
    except Exception:  # noqa: BLE001 - a model that traces only in its own way: as before
        return [False] * len(variables)
    given = closed.jaxpr.invars[len(model.trainable_variables) :]
    returned = closed.jaxpr.outvars
    return [len(returned) == len(variables) and r is g for r, g in zip(returned, given)]


def _whole_batch(model, placement, accum_steps: int = 1) -> bool:
    """Whether the model's step runs over the global batch as given, one compiled program
    (Keras's ``DataParallel`` way): its own train_step/test_step; a 2-D mesh; and, where that
    program can run (state whole, one worker, no micro-batches), a loss no per-replica mean
    gives: a ``compute_loss`` of the user's own (keras-io's Distiller ignores
    ``sample_weight``, so padding would enter it) or a ``sum`` /
    ``mean_with_sample_weight`` reduction."""
    if runs_whole(model) or getattr(placement, "model_parallel", 1) > 1:
        return True
    own_loss = fit_metrics.overrides(model, "compute_loss")
    if not own_loss and not fit_metrics.whole_batch_reductions(model):
        return False
    return (
        accum_steps == 1
        and getattr(placement, "shard", "none") == "none"
        and getattr(placement, "workers", 1) == 1
    )


class Predictor:
    """The model's ``predict_step`` (its own where it overrides it) over a batch split on the
    data axis of this process's devices, the weights replicated, compiled once per input
    shape; ``replicas``: the rows a batch must be a multiple of. The non-trainable state a
    step changes (a ``SeedGenerator``'s) is carried to the next batch and written back to the
    model at ``end``, as Keras's ``predict`` does."""

    def __init__(self, model, placement):
        from jax.sharding import Mesh

        if getattr(placement, "model_parallel", 1) > 1:  # the weights stay split, as made
            self._mesh, self.replicas = placement.grid, placement.data_parallel
        else:
            devices = list(placement.mesh.local_devices)  # several workers: each its own
            self._mesh, self.replicas = Mesh(np.array(devices), (AXIS,)), len(devices)
        self._model = model
        self._step = jax.jit(lambda state, x: model.predict_step(state, (x,)))
        self._state = None

    def begin(self) -> None:
        """Read the model's weights onto the devices (once per ``predict``: they may have
        changed since the last one): whole on each, or as split where made on their shards."""
        model = self._model
        replicated = NamedSharding(self._mesh, P())

        def placed(variable):
            held = getattr(variable.value, "sharding", None)
            on_mesh = isinstance(held, NamedSharding) and held.mesh == self._mesh
            return jax.device_put(variable.value, held if on_mesh else replicated)

        self._state = (
            [placed(v) for v in model.trainable_variables],
            [placed(v) for v in model.non_trainable_variables],
        )

    def __call__(self, x):
        x = jax.device_put(x, NamedSharding(self._mesh, P(AXIS)))
        outputs, non_trainable = self._step(self._state, x)
        self._state = (self._state[0], non_trainable)
        return outputs

    def end(self) -> None:
        """Write the carried non-trainable state back to the model's variables."""
        for variable, value in zip(self._model.non_trainable_variables, self._state[1]):
            variable.assign(value)
        self._state = None


def callback_context(placement):
    """Around every callback hook: nothing here (a variable a callback makes is the host's)."""
    import contextlib

    return contextlib.nullcontext()


def scope(placement):
    """Nothing to enter: JAX keeps the Keras variables on the host."""
    import contextlib

    return contextlib.nullcontext()


class Runner:
    """Model state on the mesh of ``placement`` and the compiled calls over it."""

    jit_compile = True  # every call, as JAX compiles it

    def __init__(
        self,
        model,
        placement,
        *,
        accum_steps: int = 1,
        jit_compile: bool = True,
        sync_batchnorm: bool = False,
        sample=None,
    ) -> None:
        # jit_compile: every call is one compiled program whatever it says (Keras's
        # jit_compile=False runs JAX's step uncompiled, for debugging only)
        self.model, self.placement = model, placement
        if placement.replicas > 1:
            fit_metrics.check_reductions(
                model,
                "with shard='none', one worker and accum_steps=1 it runs over the global batch",
            )
        self.sync_batchnorm = sync_batchnorm and batchnorm.synchronize(model) > 0
        self.mesh, self.replicas = placement.mesh, placement.replicas
        self.accum_steps = accum_steps
        self._replicated = NamedSharding(self.mesh, P())
        self._split = NamedSharding(self.mesh, P(AXIS))
        self._batches = NamedSharding(self.mesh, P(None, AXIS))
        self._train = self._evaluate = self._statistics = None
        self._compute = self._reduce = None  # --profile's calls, made when first asked
        self._all_reduce = all_reduce(self.mesh)  # as the built-in step's (why: step.py)
        self._output_losses = fit_metrics.output_loss_indices(model)
        self._masked = fit_metrics.masked_outputs(model)
        self._synced, self._aliased = True, False
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        try:
            self.layout = build_layout(placement.shard, model, optimizer, self.replicas)
        except ConfigError as e:  # worded for the flag; a ValueError naming both here
            raise FitError(_both_doors(str(e), placement.shard)) from None
        from keras.optimizers import LossScaleOptimizer

        self._scaling = isinstance(optimizer, LossScaleOptimizer)
        layout = self.layout
        self._shardings = {  # per variable: where the state of each group lives
            "trainable": [self._replicated] * len(model.trainable_variables)
            if layout is None
            else [NamedSharding(self.mesh, s) for s in layout.trainable_specs()],
            "optimizer": [self._replicated] * len(optimizer.variables)
            if layout is None
            else [NamedSharding(self.mesh, s) for s in layout.optimizer_specs()],
        }
        self._frozen = frozen(model, sample, self.replicas)
        self._frozen_specs = [self._frozen_spec(v) for v in self._frozen_variables()]
        self._frozen_shardings = [NamedSharding(self.mesh, s) for s in self._frozen_specs]
        self.frozen_values: list = []
        if any(self._frozen_specs):  # split: gathered where their layers run, as the weights
            variables = self._frozen_variables()
            axes = [len(s) - 1 if s else None for s in self._frozen_specs]
            gathered = layer_gather.prepare(
                model,
                [*(layout.variables if layout else ()), *variables],
                [*(layout.trainable if layout else ()), *axes],
                frozen=variables,
            )
            if layout is not None:
                self.layout = dataclasses.replace(layout, gathered_layers=gathered)

    def _with_frozen(self):
        return zip(self.model.non_trainable_variables, self._frozen)

    def _frozen_spec(self, variable):
        """Where a frozen weight lives: whole on every device, or under ``shard="all"`` split
        along the axis the weights' rule picks (a LoRA model's frozen backbone, whose
        weights are most of its state, split as its trainable ones are)."""
        if getattr(self.placement, "shard", "none") != "all":
            return P()
        axis = shard_axis(variable.shape, self.replicas)
        return P() if axis is None else P(*([None] * axis), AXIS)

    def _frozen_variables(self) -> list:
        return [v for v, f in self._with_frozen() if f]

    def _statistics_of(self, variables: list) -> list:
        """Of the model's non-trainable ``variables`` (or their values), those a step writes."""
        return [v for v, f in zip(variables, self._frozen) if not f]

    def _merged(self, statistics: list, frozen_values: list) -> list:
        """The model's non-trainable values in its order, from the two groups."""
        statistics, frozen_values = iter(statistics), iter(frozen_values)
        return [next(frozen_values) if f else next(statistics) for f in self._frozen]

    def from_chief(self, distribution=None) -> None:
        """Every worker's Keras variables made the chief's (weights, statistics, optimizer
        state), as TensorFlow's MultiWorkerMirroredStrategy makes its variables: one
        broadcast, at the start of each fit on several workers."""
        from jax.experimental import multihost_utils

        from mirrorfit.engine.jax import processes

        m = self.model
        variables = [*m.trainable_variables, *m.non_trainable_variables, *m.optimizer.variables]
        with processes.waiting():
            values = multihost_utils.broadcast_one_to_all(
                [np.asarray(v.value) for v in variables], is_source=self.placement.is_chief
            )
        for var, value in zip(variables, values):
            var.assign(value)
        self.reload()

    # -- state -------------------------------------------------------------------------------
    def state_bytes_per_device(self) -> int:
        """Bytes the fullest device holds of the training state and of the model's own
        variables (weights, statistics, optimizer state: a whole copy on one device counts
        there), read from the arrays' shards."""
        s = self.state
        state = [*s.trainable, *s.non_trainable, *s.optimizer, *self.frozen_values]
        return state_bytes_per_device([*state, *held_by_model(self.model)])

    def peak_device_bytes(self) -> int | None:
        """The devices' peak memory in use so far, where the platform reports it (GPUs)."""
        return peak_device_bytes(self.mesh.local_devices)

    def describe_sharding(self) -> str:
        """One line: what of the state is split over the devices."""
        if self.layout is None:
            return describe_unsplit(self.placement.shard, self.replicas)
        return self.layout.describe()

    def load(self) -> None:
        """The Keras variables' values as the devices' state, metrics reset (at an epoch's
        start, after its callbacks)."""
        m = self.model
        m.reset_metrics()  # the merge adds each replica's change to the reset state
        self._initial_metrics = [np.asarray(v.value) for v in m.metrics_variables]
        self.state = State(
            [],
            [],
            [],
            self.placement.put(stacked(self._initial_metrics, self.replicas), self._split),
        )
        self.reload()

    def reload(self) -> None:
        """The model's and optimizer's variables as the devices' state again (a callback may
        have changed them); the metrics so far are kept."""
        m, put = self.model, self.placement.put
        # one buffer an entry: two variables may hold one array (``b.assign(a)``), and a
        # buffer donated twice crashes XLA (Keras's own fit: "donate the same buffer twice")
        trainable, optimizer = distinct_arrays(
            [v.value for v in m.trainable_variables], [v.value for v in m.optimizer.variables]
        )
        # In one process the variables' own buffers are the state, and each call's result is
        # written back into them (:meth:`_shared`): one copy on the devices, as Keras's own
        # fit keeps (not a whole second one on device 0 beside the state). Made on their
        # shards (shard="all"), they are laid out so already; else laid out so here, once.
        # Several processes: copies (put copies), so the next call's donation leaves the
        # variables be.
        one = self.placement.workers == 1
        self._aliased = one and all(
            _held_as(values, self._shardings[group])
            for values, group in ((trainable, "trainable"), (optimizer, "optimizer"))
        )
        if not self._aliased:
            trainable = put(trainable, self._shardings["trainable"])
            optimizer = put(optimizer, self._shardings["optimizer"])
            if one:
                self.state = self.state._replace(trainable=trainable, optimizer=optimizer)
                self._shared()
                self._aliased = True
        # Frozen weights are read, never written or donated: the variables' own arrays where
        # they are laid out so already (created on their shards), else one copy laid out so.
        values = [v.value for v in self._frozen_variables()]
        self.frozen_values = [
            v if self.placement.workers == 1 and _held_as([v], [s]) else put([v], s)[0]
            for v, s in zip(values, self._frozen_shardings)
        ]
        statistics = self._statistics_of(m.non_trainable_variables)
        self.state = self.state._replace(
            trainable=trainable,
            non_trainable=put(stacked([v.value for v in statistics], self.replicas), self._split),
            optimizer=optimizer,
        )
        self._synced, self._statistics = True, None

    def _shared(self) -> None:
        """The state's weights and optimizer slots written into the Keras variables, the same
        buffers (where :meth:`reload` found them on their shards): the call donated the ones
        the variables held."""
        m, s = self.model, self.state
        for var, value in zip(m.trainable_variables, s.trainable):
            var.assign(value)  # the same sharding: Keras keeps the array as it is
        for var, value in zip(m.optimizer.variables, s.optimizer):
            var.assign(value)

    def sync(self) -> None:
        """The devices' state into the Keras variables (a callback reads or saves them)."""
        if self._synced:
            return
        s, m = self.state, self.model
        statistics = self._statistics_of(m.non_trainable_variables)
        for var, value in zip(statistics, self.placement.averaged(s.non_trainable)):
            var.assign(np.asarray(value))
        self._synced = True
        if self._aliased:  # the variables hold the state's own buffers (_shared)
            return
        trainable, optimizer = s.trainable, s.optimizer
        if self.layout is not None and self.placement.workers > 1:
            # split over processes: made whole first, a collective every worker runs here
            trainable = self.placement.replicated(trainable)
            optimizer = self.placement.replicated(optimizer)
        for var, value in zip(m.trainable_variables, trainable):
            var.assign(np.asarray(value))
        for var, value in zip(m.optimizer.variables, optimizer):
            var.assign(np.asarray(value))

    def reset_metrics(self) -> None:
        self.state = self.state._replace(
            metrics=self.placement.put(stacked(self._initial_metrics, self.replicas), self._split)
        )

    def logs(self) -> dict[str, float]:
        """The metrics so far, merged over replicas (Keras's ``get_metrics_result``)."""
        metrics = self.state.metrics
        if self.placement.workers > 1:  # every device's values, on every worker: a collective
            metrics = self.placement.replicated(metrics)
        values = fit_metrics.merged(self._initial_metrics, [np.asarray(v) for v in metrics])
        for var, value in zip(self.model.metrics_variables, values):
            var.assign(value)
        return fit_metrics.results(self.model)

    def loss_later(self):
        """A function returning the mean training loss as it is now (None where Keras's loss
        tracker counted nothing), read when it is called, with NumPy alone: the divergence
        guard reads each call's after the next call is on its way, and a Keras ``result()``
        per call would cost more than a small model's step. Every worker calls it in the same
        order (several workers: a collective)."""
        where = fit_metrics.loss_tracker_indices(self.model)
        if where is None:
            return lambda: None
        # Copies, dispatched now (no wait): the next call donates the state's own buffers.
        values = [jnp.copy(self.state.metrics[i]) for i in where]
        initial = [self._initial_metrics[i] for i in where]

        def read() -> float | None:
            pair = values
            if self.placement.workers > 1:  # every device's values, on every worker
                pair = self.placement.replicated(pair)
            total, count = fit_metrics.merged(initial, [np.asarray(v) for v in pair])
            return float(total / count) if count else None

        return read

    # -- the compiled calls ------------------------------------------------------------------
    def put(self, block: dict):
        """A block of padded global batches (leaves ``[L, B, ...]``) on the devices (several
        workers: each puts its own devices' shares of the block every worker holds)."""
        if self.placement.workers == 1:
            return jax.device_put(block, self._batches)
        return jax.tree.map(lambda a: self.placement.put([a], self._batches)[0], block)

    def train(self, block, steps: int) -> None:
        """``steps`` optimizer steps over the first ``steps`` batches of ``block``."""
        if self._train is None:
            self._train = self._build_train(block)
        self.state = self._train(self.state, block, self.frozen_values, np.int32(steps))
        self._synced, self._statistics = False, None
        if self._aliased:
            self._shared()

    def evaluate(self, block, batches: int) -> None:
        """Update the metrics with the first ``batches`` batches of ``block``."""
        if self._evaluate is None:
            self._evaluate = jax.jit(
                self._over_mesh(self._eval_per_device, train=False), donate_argnums=(0,)
            )
        if self._statistics is None:
            # Every replica evaluates with the same statistics (batch norm's moving means):
            # their mean over the devices, what the model holds after sync, as on one device.
            self._statistics = self.placement.put(
                stacked(self.placement.averaged(self.state.non_trainable), self.replicas),
                self._split,
            )
        metrics = self._evaluate(
            self.state.metrics,
            self.state.trainable,
            self._statistics,
            self.frozen_values,
            block,
            np.int32(batches),
        )
        self.state = self.state._replace(metrics=metrics)

    # -- --profile: the step's parts apart ----------------------------------------------------
    def compute_only(self, block, steps: int) -> None:
        """``steps`` steps' forward and backward passes (every micro-batch) on every device,
        without the all-reduce or the update (under ``shard="all"`` the weights' gathers
        included); returns when they are done."""
        if self._compute is None:
            in_specs, _ = self._train_specs()  # laid out as the training call's
            self._compute = jax.jit(
                jax.shard_map(
                    self._gradients_per_device,
                    mesh=self.mesh,
                    in_specs=in_specs,
                    out_specs=P(AXIS),
                    check_vma=False,
                )
            )
        total = self._compute(self.state, block, self.frozen_values, np.int32(steps))
        jax.block_until_ready(total)

    def _gradients_per_device(self, state: State, block, frozen_values, steps):
        layout, k = self.layout, self.accum_steps
        kept_sharded = layout is not None and layout.mode == "all"
        stored = state.trainable
        trainable = layout.step_weights(stored) if kept_sharded else stored
        non_trainable, metrics = [a[0] for a in state.non_trainable], [a[0] for a in state.metrics]
        grad = jax.value_and_grad(self._loss, has_aux=True)

        def body(i, total):
            micro = jax.tree.map(lambda a: a[i].reshape((k, -1) + a.shape[2:]), block)
            for j in range(k):  # the result is consumed: nothing is pruned away
                part = jax.tree.map(lambda a, j=j: a[j], micro)
                with self._batchnorm_across(part):
                    _, g = grad(
                        trainable,
                        non_trainable,
                        frozen_values,
                        metrics,
                        state.optimizer,
                        part,
                        True,
                        stored if kept_sharded else None,
                    )
                total = total + sum(jnp.sum(d.astype(jnp.float32)) for d in g)
            return total

        return jax.lax.fori_loop(0, steps, body, jnp.float32(0))[None]

    def all_reduce_only(self, steps: int) -> None:
        """``steps`` of the step's all-reduces (or reduce-scatters, where the state is split)
        of gradient-sized arrays over the devices; returns when they are done."""
        if self._reduce is None:
            shapes = [(v.shape, v.dtype) for v in self.model.trainable_variables]

            def per_device(steps):
                def body(i, total):
                    grads = [jnp.full(shape, i, dtype) for shape, dtype in shapes]
                    summed = (
                        self._all_reduce(grads)
                        if self.layout is None
                        else self.layout.reduced(grads, self._all_reduce)
                    )
                    return total + sum(jnp.sum(r.astype(jnp.float32)) for r in summed)

                return jax.lax.fori_loop(0, steps, body, jnp.float32(0))[None]

            self._reduce = jax.jit(
                jax.shard_map(
                    per_device, mesh=self.mesh, in_specs=P(), out_specs=P(AXIS), check_vma=False
                )
            )
        jax.block_until_ready(self._reduce(np.int32(steps)))

    def _loss(
        self,
        trainable,
        non_trainable,
        frozen_values,
        metrics,
        optimizer,
        batch,
        training: bool,
        stored=None,
    ):
        """``stored``: the split weights under --shard all, gathered layer by layer;
        ``frozen_values``: the frozen weights as this device holds them (a split one is
        gathered whole here). Returns the statistics alone of the non-trainable values."""
        model, layout = self.model, self.layout
        before = metrics
        whole = [
            v if len(spec) == 0 else jax.lax.all_gather(v, AXIS, axis=len(spec) - 1, tiled=True)
            for v, spec in zip(frozen_values, self._frozen_specs)
        ]
        split_frozen = [
            (var, v, len(spec) - 1)
            for var, v, spec in zip(self._frozen_variables(), frozen_values, self._frozen_specs)
            if len(spec)
        ]
        with layer_gather.weights(layout, trainable, stored, split_frozen) as values:
            loss, (unscaled, y_pred, non_trainable, metrics) = model.compute_loss_and_updates(
                values,
                self._merged(non_trainable, whole),
                metrics,
                batch["x"],
                batch.get("y"),
                fit_metrics.loss_weights(batch, masked=self._masked),
                training=training,
                optimizer_variables=None
                if not training
                else optimizer
                if layout is None
                else layout.whole_stand_ins(optimizer),
            )  # fp16's loss scale, replicated
        metrics = list(metrics)
        for i in self._output_losses:
            metrics[i] = fit_metrics.reweighted(before[i], metrics[i], batch["scale"])
        non_trainable = self._statistics_of(non_trainable)
        return loss / (self.replicas * self.accum_steps), (unscaled, y_pred, non_trainable, metrics)

    def _update_metrics(self, metrics, batch, y_pred, unscaled):
        from keras.src.backend import StatelessScope

        refs = self.model.metrics_variables
        with StatelessScope(state_mapping=list(zip(refs, metrics))) as scope:
            fit_metrics.update(self.model, batch, y_pred, unscaled)
        return [
            scope.get_current_value(r) if scope.get_current_value(r) is not None else v
            for r, v in zip(refs, metrics)
        ]

    def _step(self, state: State, batch: dict, frozen_values: list) -> State:
        """One optimizer step on this device's share of one global batch."""
        k, layout = self.accum_steps, self.layout
        stored, non_trainable, optimizer, metrics = state
        kept_sharded = layout is not None and layout.mode == "all"
        trainable = layout.step_weights(stored) if kept_sharded else stored
        micro = jax.tree.map(lambda a: a.reshape((k, -1) + a.shape[1:]), batch)
        grad = jax.value_and_grad(self._loss, has_aux=True)
        total = [jnp.zeros_like(t) for t in trainable]
        for j in range(k):  # unrolled: K is small, and XLA's CPU convolutions stay fast
            part = jax.tree.map(lambda a, j=j: a[j], micro)
            with self._batchnorm_across(part):
                (_, (unscaled, y_pred, non_trainable, metrics)), g = grad(
                    trainable,
                    non_trainable,
                    frozen_values,
                    metrics,
                    optimizer,
                    part,
                    True,
                    stored if kept_sharded else None,
                )
            metrics = self._update_metrics(metrics, part, y_pred, unscaled)
            total = [t + d for t, d in zip(total, g)]
        if layout is None:
            total = self._all_reduce(total)  # the step's one all-reduce
            trainable, optimizer = self.model.optimizer.stateless_apply(optimizer, total, trainable)
            return State(trainable, non_trainable, optimizer, metrics)
        # sharded (engine/jax/sharding.py): each device updates its slices
        total = layout.reduced(total, self._all_reduce)
        if self._scaling:
            total = layout.all_finite(total)
        mine = stored if kept_sharded else layout.local(trainable)
        mine, optimizer = layout.local_optimizer.stateless_apply(optimizer, total, mine)
        return State(
            mine if kept_sharded else layout.gathered(mine), non_trainable, optimizer, metrics
        )

    def _batchnorm_across(self, part):
        """Where synchronized: batch statistics summed over the mesh's data axis (every
        worker's devices), the padding rows left out."""
        import contextlib

        if not self.sync_batchnorm:
            return contextlib.nullcontext()
        return batchnorm.across(lambda values: jax.lax.psum(values, AXIS), part["mask"])

    def _train_per_device(self, state: State, block, frozen_values, steps, *, one: bool = False):
        state = State(
            state.trainable,
            [a[0] for a in state.non_trainable],
            state.optimizer,
            [a[0] for a in state.metrics],
        )

        def body(i, state):
            return self._step(state, jax.tree.map(lambda a: a[i], block), frozen_values)

        state = body(steps, state) if one else jax.lax.fori_loop(0, steps, body, state)
        return State(
            state.trainable,
            [a[None] for a in state.non_trainable],
            state.optimizer,
            [a[None] for a in state.metrics],
        )

    def _eval_per_device(self, metrics, trainable, non_trainable, frozen_values, block, batches):
        non_trainable = [a[0] for a in non_trainable]

        def body(i, metrics):
            batch = jax.tree.map(lambda a: a[i], block)
            _, (unscaled, y_pred, _, metrics) = self._loss(
                trainable, non_trainable, frozen_values, metrics, None, batch, False
            )
            return self._update_metrics(metrics, batch, y_pred, unscaled)

        metrics = jax.lax.fori_loop(0, batches, body, [a[0] for a in metrics])
        return [a[None] for a in metrics]

    def _train_specs(self) -> tuple:
        """(in_specs, out_specs) of a training call over the mesh: (state, block, frozen
        values, steps) in, the state out."""
        specs = State(P(), P(AXIS), P(), P(AXIS))
        if self.layout is not None:
            specs = State(
                self.layout.trainable_specs(), P(AXIS), self.layout.optimizer_specs(), P(AXIS)
            )
        return (specs, P(None, AXIS), self._frozen_specs, P()), specs

    def _over_mesh(self, per_device, *, train: bool = True):
        if train:
            in_specs, out_specs = self._train_specs()
        else:
            frozen_specs = self._frozen_specs
            in_specs = (P(AXIS), P(), P(AXIS), frozen_specs, P(None, AXIS), P())
            out_specs = P(AXIS)
        # check_vma off, as in engine/jax/step.py: an RNN's constant initial state against its
        # per-device carry; gradients stay per device until the one psum.
        return jax.shard_map(
            per_device, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False
        )

    def _build_train(self, block):
        import functools

        looped = jax.jit(self._over_mesh(self._train_per_device), donate_argnums=(0,))
        single = jax.jit(
            self._over_mesh(functools.partial(self._train_per_device, one=True)),
            donate_argnums=(0,),
        )
        chooser = None
        if self.mesh.devices.flat[0].platform == "cpu":
            chooser = self._convolves
        return _Train(looped, single, chooser)

    def _convolves(self, state, block) -> bool:
        """Whether the model's forward pass holds a convolution (see step._Train)."""
        model = self.model
        x = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(
                (max(1, a.shape[1] // self.replicas), *a.shape[2:]), a.dtype
            ),
            block["x"],
        )
        t = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.trainable_variables]
        n = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.non_trainable_variables]
        kwargs = {"training": True} if model._call_has_training_arg else {}
        return _has_convolution(
            jax.make_jaxpr(lambda t, n, x: model.stateless_call(t, n, x, **kwargs)[0])(t, n, x)
        )


def _held_as(values, shardings) -> bool:
    """Whether every array of ``values`` is laid out as ``shardings`` say (device arrays
    only), in a sharding of the same kind: on one device an array of its own (not a mesh's
    NamedSharding) is laid out alike, but jit compiles the step again for the first call's
    result, which is the mesh's."""
    return all(
        isinstance(v, jax.Array)
        and type(v.sharding) is type(s)
        and v.sharding.is_equivalent_to(s, v.ndim)
        for v, s in zip(values, shardings)
    )


def _both_doors(message: str, shard: str) -> str:
    """A --shard refusal worded for mirrorfit.setup's argument and the flag alike."""
    message = message.replace("--shard none", "shard='none' (--shard none)")
    return message.replace("--shard", f"shard={shard!r} (--shard {shard})", 1)
