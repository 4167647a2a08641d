"""The TensorFlow engine for ``mirrorfit.fit``: a compiled Keras model trained as compiled,
under ``mirrorfit.setup``'s strategy. Per replica, in ``strategy.run`` in one ``tf.function``
of S steps: the forward pass, the model's ``compute_loss`` over K micro-batches, its
optimizer's ``apply_gradients`` (one all-reduce a step); a ``train_step``/``test_step``
override runs per replica instead, on unpadded batches.
(why, and several workers: docs/architecture.md#the-engines-under-fit)
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from keras.src.losses.loss import unscale_loss_for_distribution

from mirrorfit.engine.tensorflow import coordinated_fit, shared_copy
from mirrorfit.errors import FitError
from mirrorfit.fitting import batchnorm
from mirrorfit.fitting import metrics as fit_metrics


# The Keras data adapters epoch 1 reads anew after the first batch built the model: arrays
# (mirrorfit draws each epoch's permutation); Keras's TensorFlow fit reads a tf.data source's
# first pass for epoch 1.
READ_AGAIN = frozenset({"ArrayDataAdapter"})


def _agree_on_overflow(grads: list[tf.Tensor]) -> list[tf.Tensor]:
    """Make every replica see non-finite gradients if any replica has them (one scalar
    all-reduce), so that fp16 loss scaling skips the step on all of them alike.
    (why: docs/architecture.md#tensorflow-the-step)
    """
    local_bad = tf.cast(
        tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])),
        tf.float32,
    )
    context = tf.distribute.get_replica_context()
    any_bad = context.all_reduce(tf.distribute.ReduceOp.SUM, local_bad) > 0
    return [
        tf.where(any_bad, tf.fill(tf.shape(g), tf.constant(float("nan"), g.dtype)), g)
        for g in grads
    ]


def placement(model, chosen=None):
    """The strategy the model was built under (``mirrorfit.setup``'s, made the default)."""
    return model.distribute_strategy


def replicas(strategy) -> int:
    return strategy.num_replicas_in_sync


def pads(model, step: str, strategy=None, accum_steps: int = 1) -> bool:
    """Whether ``step`` (``train``/``test``) batches are padded: not where Keras's step runs
    per replica on the batch as the data gave it (:func:`_keras_step`)."""
    return not _keras_step(model, step, accum_steps)


def _plain_steps(model) -> bool:
    """Whether the model's train_step and test_step are Keras's own."""
    return not (
        fit_metrics.overrides(model, "train_step") or fit_metrics.overrides(model, "test_step")
    )


def _keras_step(model, step: str, accum_steps: int) -> bool:
    """Whether ``step`` runs as the model's ``train_step``/``test_step`` per replica, on its
    share of the batch as given: its own, or Keras's calling a ``compute_loss`` of the user's
    own (which may ignore ``sample_weight``, so padding would enter it; keras-io's
    Distiller) where no micro-batches split it."""
    if fit_metrics.overrides(model, f"{step}_step"):
        return True
    return fit_metrics.overrides(model, "compute_loss") and accum_steps == 1


def scope(strategy):
    """The strategy's scope: the model is built under it."""
    return strategy.scope()


@contextlib.contextmanager
def callback_context(strategy):
    """Around every callback hook: over several workers, no default strategy. A variable a
    callback makes (Keras's saving makes a reference optimizer) is then this process's own;
    a strategy's would be a collective that every worker must join, and a callback of the
    chief's only would leave the others waiting in their next one."""
    from tensorflow.python.framework import ops

    graph = ops.get_default_graph()
    if (
        not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        or graph._global_distribute_strategy_scope is None  # noqa: SLF001 (no public accessor)
        or len(graph._distribution_strategy_stack) != 1  # noqa: SLF001 (inside a scope)
    ):
        yield
        return
    tf.distribute.experimental_set_strategy(None)
    try:
        yield
    finally:
        tf.distribute.experimental_set_strategy(strategy)


class Predictor:
    """The model's ``predict_step`` (its own where it overrides it) per replica of this
    worker, each on its contiguous equal share of the batch, the outputs in order;
    ``replicas``: the rows a batch must be a multiple of."""

    def __init__(self, model, strategy):
        self._strategy = strategy
        self.replicas = len(strategy.extended.worker_devices)  # several workers: each its own
        self._run = tf.function(
            lambda values: strategy.run(model.predict_step, args=(values,)),
            reduce_retracing=True,
        )

    def begin(self) -> None:
        """Nothing to read: the compiled function reads the model's variables."""

    def end(self) -> None:
        """Nothing to write: the compiled function updates the model's variables."""

    def __call__(self, x):
        share = tf.nest.flatten(x)[0].shape[0] // self.replicas

        def piece(context):
            first = (context.replica_id_in_sync_group % self.replicas) * share
            return (tf.nest.map_structure(lambda a: tf.constant(a[first : first + share]), x),)

        values = self._strategy.experimental_distribute_values_from_function(piece)
        parts = self._strategy.experimental_local_results(self._run(values))
        return tf.nest.map_structure(lambda *a: tf.concat(a, 0).numpy(), *parts)


def check_model(model, strategy, distribution=None) -> None:
    """FitError (a ValueError) for a model whose variables were not made under the strategy,
    a parameter-server strategy, or a multi-worker one not made by ``mirrorfit.setup``
    (``distribution``: its workers and their collectives)."""
    if coordinated_fit.coordinated(strategy):
        coordinated_fit.check_model(model, strategy)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and distribution is None:
        raise FitError(
            "the model was built under a MultiWorkerMirroredStrategy of your own; call "
            "mirrorfit.setup(strategy='multi-worker') instead, then build and compile the "
            "model (mirrorfit.fit checks that the workers' batches agree through it)"
        )
    for step, given in fit_metrics.own_step_arguments(model).items():
        if given != 1:  # a TypeError from inside the step, else
            raise FitError(
                f"{type(model).__name__}.{step} takes {given} arguments; on TensorFlow Keras "
                f"calls {step}(self, data) (keras.io's guide 'Customizing what happens in "
                "fit() with TensorFlow'); write that, or use backend 'jax'"
            )
    check_variables(model, strategy)


def check_variables(model, strategy) -> None:
    """FitError for model variables made outside the strategy (before ``mirrorfit.setup``)."""
    if strategy.num_replicas_in_sync == 1:
        return
    made_outside = [
        v.path for v in model.variables if not strategy.extended.variable_created_in_scope(v.value)
    ]
    if made_outside:
        raise FitError(
            f"the model's variables ({made_outside[0]}, ...) were made before "
            "mirrorfit.setup(); call mirrorfit.setup(...) first, then build and "
            "compile the model"
        )


def runner(model, placement, *, sample=None, **settings) -> Runner:
    """The runner for ``model``: its own train_step/test_step too run per replica; under
    parameter servers, scheduled (:mod:`.coordinated_fit`). (``sample``, the first batch's
    inputs: the variables are the state here, so nothing needs telling apart.)"""
    if coordinated_fit.coordinated(placement):
        return _ScheduledRunner(model, placement, **settings)
    return Runner(model, placement, **settings)


class Runner:
    """The compiled train and eval calls for ``model`` under ``strategy``."""

    def __init__(
        self,
        model,
        strategy,
        *,
        accum_steps: int = 1,
        jit_compile: bool = False,
        sync_batchnorm: bool = False,
    ) -> None:
        self.model, self.strategy, self.accum_steps = model, strategy, accum_steps
        self.sync_batchnorm = sync_batchnorm and batchnorm.synchronize(model) > 0
        self.replicas = strategy.num_replicas_in_sync
        self._divisor = self.replicas  # of each replica's loss: its share of the step's
        self._central = isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
        if self._central and self.replicas > 1:
            _check_central_state(model)
            jit_compile = shared_copy.without_xla(model, jit_compile, "central storage")
        self._own_train = _keras_step(model, "train", accum_steps)
        if self._own_train and accum_steps > 1:
            raise FitError(
                f"accum_steps={accum_steps}: {type(model).__name__}'s own train_step takes the "
                "whole batch, which mirrorfit cannot split into micro-batches; leave "
                "accum_steps at 1"
            )
        self._own_test = _keras_step(model, "test", accum_steps)
        if self.replicas > 1:
            _check_optimizer(model.optimizer)
            if not self._own_train:
                fit_metrics.check_reductions(
                    model, "backend='jax' computes it over the global batch"
                )
        # Keras clips each replica's gradients before its all-reduce: the replicas' sum is
        # reduced first here, so the clip sees the whole batch's gradients, as on one device
        self._reduce_first = not self._own_train and self.replicas > 1 and _clips(model.optimizer)
        if (self._own_train or self._own_test) and self.replicas > 1:
            import warnings

            whose = "train_step/test_step" if not _plain_steps(model) else "compute_loss"
            warnings.warn(
                f"{type(model).__name__}'s own {whose} runs per replica on TensorFlow: the "
                "logs its step returns are the replicas' values averaged (a mean over unequal "
                "shares of a partial batch, a maximum, a count or a sum is not one device's); "
                "backend='jax' runs it over the global batch",
                stacklevel=2,
            )
        # BatchNormalization's moving statistics, which each replica updates from its own
        # share of the batch: averaged over the replicas after each step (one small
        # all-reduce), so that every copy, the checkpoints and the model after fit hold their
        # mean (JAX's one program updates one copy so). Keras's MirroredStrategy leaves each
        # replica its own, and saves replica 0's: in-process predictions then differ from the
        # saved model's (a Keras user measured 1.5e-3).
        self._moving = (
            []
            if self.sync_batchnorm
            or self.replicas == 1
            or self._central
            or coordinated_fit.coordinated(strategy)  # one copy, on the ps tasks
            else [
                v
                for layer in batchnorm.per_replica(model)
                for v in (layer.moving_mean, layer.moving_variance)
            ]
        )
        self._output_losses = fit_metrics.output_loss_indices(model)
        self._masked = fit_metrics.masked_outputs(model)
        # A model's own step may need AutoGraph (Python control flow on tensors), as under
        # Keras's fit; mirrorfit's own is written without it.
        # XLA (the model's jit_compile, or --xla): each replica's forward and backward pass
        # compiled, as the built-in step does; not the optimizer's update, whose all-reduce
        # reaches the other replicas' variables (which XLA refuses: Keras's own fit fails so).
        self.jit_compile = bool(jit_compile) and not self._own_train
        if self.jit_compile and self.sync_batchnorm:
            raise FitError(
                "sync_batchnorm with jit_compile=True: on TensorFlow a replica's XLA-compiled "
                "pass cannot all-reduce its batch statistics (TensorFlow refuses a merge_call "
                "there); compile with jit_compile=False (no --xla), or use backend='jax'"
            )
        self._gradients = (
            tf.function(self._micro_gradients, jit_compile=True)
            if self.jit_compile
            else self._micro_gradients
        )
        self._train = tf.function(
            self._looped(self._replica_train, self._own_train), autograph=self._own_train
        )
        self._evaluate = tf.function(
            self._looped(self._replica_eval, self._own_test), autograph=self._own_test
        )
        self._compute = self._reduce = None  # --profile's calls, made when first asked
        # Keras keeps its global seed generator (unseeded random ops) per thread, and each
        # replica traces in a thread of its own: each would make one inside the traced step,
        # which tf.function refuses. Made here once, and handed to every replica's thread.
        self._seeds = _global_seed_generator()
        # A model's own train_step/test_step: the logs its last step returned are the logs,
        # every key as it named it (Keras's fit reports them so); None: the metrics' results.
        self._step_logs: dict | None = None

    def load(self) -> None:
        """Nothing to place (the variables are the strategy's): checked they are."""
        check_variables(self.model, self.strategy)
        _no_rebuild_once_built(self.model)

    def state_bytes_per_device(self) -> int:
        from mirrorfit.engine.tensorflow.memory import whole_state_bytes

        return whole_state_bytes(self.model, self.model.optimizer)

    def peak_device_bytes(self) -> int | None:
        from mirrorfit.engine.tensorflow.memory import gpu_peak_bytes

        return gpu_peak_bytes()

    def describe_sharding(self) -> str:
        from mirrorfit.engine.tensorflow.memory import REPLICATED

        if self._central:
            return "one copy, central storage (every replica reads it each step)"
        return REPLICATED

    def from_chief(self, distribution) -> None:
        """Every worker's variables made the chief's (weights, statistics, optimizer state):
        one all-reduce, at the start of each fit on several workers (``distribution``)."""
        m = self.model
        variables = [*m.trainable_variables, *m.non_trainable_variables, *m.optimizer.variables]
        values = distribution.from_chief([v.numpy() for v in variables])
        for var, value in zip(variables, values):
            var.assign(value)

    def reload(self) -> None:
        """Nothing: the Keras variables are the state."""

    def sync(self) -> None:
        """Nothing: the Keras variables are the state."""

    def reset_metrics(self) -> None:
        self.model.reset_metrics()
        self._step_logs = None

    def logs(self) -> dict[str, float]:
        if self._step_logs is not None:
            return dict(self._step_logs)
        return fit_metrics.results(self.model)

    def loss_later(self):
        """The mean training loss now (None where Keras's loss tracker counted nothing), for
        a later call (the JAX runner's way): a call of steps has run when it returns here, so
        it is read now, from the tracker's variables alone."""
        tracker = getattr(self.model, "_loss_tracker", None)
        if tracker is None:
            return lambda: None
        total, count = (float(v.numpy()) for v in tracker.variables)
        loss = total / count if count else None
        return lambda: loss

    def put(self, block: dict):
        """Each replica's contiguous share of every batch of the block (leaves ``[S, B, ...]``;
        a batch of B not divisible by the replicas, only given to a model's own step, is split
        as evenly as it goes)."""
        rows = tf.nest.flatten(block)[0].shape[1]
        bounds = [r * rows // self.replicas for r in range(self.replicas + 1)]

        def piece(context):
            r = context.replica_id_in_sync_group
            lo, hi = bounds[r], bounds[r + 1]
            return tf.nest.map_structure(lambda a: tf.constant(a[:, lo:hi]), block)

        return self.strategy.experimental_distribute_values_from_function(piece)

    def train(self, block, steps: int) -> None:
        with self._unscaled("train"), self._increments():
            self._step_logs = _python(self._train(block, tf.constant(steps, tf.int32)))

    def evaluate(self, block, batches: int) -> None:
        with self._unscaled("test"), self._increments():
            self._step_logs = _python(self._evaluate(block, tf.constant(batches, tf.int32)))

    def _increments(self):
        """Where the replicas share one copy of each variable (central storage), Keras's
        ``assign_add`` (an assign of v + x, which the strategy would sum over the replicas:
        every metric doubled) made one ``tf.Variable.assign_add`` while the steps trace, and a
        metric that assigns its state refused."""
        if not self._central or self.replicas == 1:  # one replica: Keras's assigns are right
            return contextlib.nullcontext()
        return shared_copy.increments_only(
            self.model, "under central storage the replicas' assigns to one copy add up"
        )

    # -- --profile: the step's parts apart ----------------------------------------------------
    def compute_only(self, block, steps: int) -> None:
        """``steps`` steps' forward and backward passes (every micro-batch) on every replica,
        without the all-reduce or the update; returns when they are done."""
        if self._compute is None:

            def replica(block, i):
                _use_seed_generator(self._seeds)
                batch, k = tf.nest.map_structure(lambda a: a[i], block), self.accum_steps
                total = tf.constant(0.0)
                for j in range(k):  # the result is consumed: nothing is pruned away
                    part = tf.nest.map_structure(
                        lambda a, j=j: tf.reshape(a, [k, -1] + a.shape[1:].as_list())[j], batch
                    )
                    grads, _, _ = self._gradients(part)
                    total += tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads])
                return total

            self._compute = tf.function(self._summed(replica, with_block=True))
        with _as_one_device(self.model, self.replicas, self._own_train, self._reduce_first):
            self._compute(block, tf.constant(steps, tf.int32)).numpy()

    def all_reduce_only(self, steps: int) -> None:
        """``steps`` all-reduces of gradient-sized tensors over the replicas (as the step's
        own); returns when they are done."""
        if self._reduce is None:
            weights = self.model.trainable_weights

            def replica(i):
                values = [tf.fill(w.shape, tf.cast(i, w.dtype)) for w in weights]
                reduced = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, values
                )
                return tf.add_n([tf.reduce_sum(tf.cast(r, tf.float32)) for r in reduced])

            self._reduce = tf.function(self._summed(replica, with_block=False))
        self._reduce(None, tf.constant(steps, tf.int32)).numpy()

    def _summed(self, replica_fn, *, with_block: bool):
        """``run(block, n)``: the sum over n calls and the replicas of ``replica_fn``'s scalar
        (``replica_fn(block, i)``, or ``replica_fn(i)``)."""

        def run(block, n):
            def body(i, total):
                args = (block, i) if with_block else (i,)
                out = self.strategy.run(replica_fn, args=args)
                return i + 1, total + tf.add_n(self.strategy.experimental_local_results(out))

            start = (tf.constant(0, tf.int32), tf.constant(0.0))
            return tf.while_loop(lambda i, _: i < n, body, start)[1]

        return run

    def _looped(self, replica_fn, returns_logs: bool):
        """``run(block, n)``: ``replica_fn(block, i)`` on every replica for i < n; with
        ``returns_logs``, the logs the last step returned (:meth:`_over_replicas`), else
        None."""

        def run(block, n):
            if not returns_logs:

                def body(i):
                    self.strategy.run(replica_fn, args=(block, i))
                    return (i + 1,)

                tf.while_loop(lambda i: i < n, body, (tf.constant(0, tf.int32),))
                return None

            def step(i):
                logs = self.strategy.run(replica_fn, args=(block, i))
                return tf.nest.map_structure(self._over_replicas, dict(logs))

            logs = step(tf.constant(0, tf.int32))  # n >= 1: its structure for the loop
            _, logs = tf.while_loop(
                lambda i, _: i < n, lambda i, _: (i + 1, step(i)), (tf.constant(1, tf.int32), logs)
            )
            return logs

        return run

    def _over_replicas(self, value):
        """A value a model's own step returned on each replica, as one: a float's mean (a
        tracker's result read inside a replica is that replica's, over its own equal share of
        the batches), else the first replica's."""
        first = tf.convert_to_tensor(self.strategy.experimental_local_results(value)[0])
        if first.dtype.is_floating:
            return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return first

    def _replica_train(self, block, i):
        _use_seed_generator(self._seeds)
        model = self.model
        batch = tf.nest.map_structure(lambda a: a[i], block)
        if self._own_train:
            with self._batchnorm_across(None):
                logs = model.train_step(batch["data"])
            self._average_moving()
            return logs
        k, weights = self.accum_steps, model.trainable_weights
        total = None
        for j in range(k):  # K is small: unrolled
            part = tf.nest.map_structure(
                lambda a, j=j: tf.reshape(a, [k, -1] + a.shape[1:].as_list())[j], batch
            )
            grads, y_pred, loss = self._gradients(part)
            total = grads if total is None else [t + g for t, g in zip(total, grads)]
            fit_metrics.update(model, part, y_pred, unscale_loss_for_distribution(loss))
        if self._reduce_first:  # the optimizer's own all-reduce then passes them on
            total = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, total
            )
        if isinstance(model.optimizer, _loss_scale_optimizer()):
            total = _agree_on_overflow(total)
        model.optimizer.apply_gradients(zip(total, weights))
        self._average_moving()

    def _average_moving(self) -> None:
        """Each moving statistic set to its mean over every replica (in a replica's step)."""
        if not self._moving:
            return
        context = tf.distribute.get_replica_context()
        means = context.all_reduce(
            tf.distribute.ReduceOp.MEAN, [tf.convert_to_tensor(v.value) for v in self._moving]
        )
        for variable, mean in zip(self._moving, means):
            variable.assign(mean)

    def _micro_gradients(self, part):
        """One micro-batch's (gradients of its share of the step's loss, predictions, loss)."""
        model, weights = self.model, self.model.trainable_weights
        with tf.GradientTape() as tape, self._batchnorm_across(part["mask"]):
            y_pred = self._call(part["x"], True)
            loss = self._compute_loss(part, y_pred, True)
            scaled = model.optimizer.scale_loss(loss / self.accum_steps)
        grads = tape.gradient(scaled, weights)
        grads = [tf.zeros_like(w) if g is None else g for g, w in zip(grads, weights)]
        return grads, y_pred, loss

    def _batchnorm_across(self, rows):
        """Where synchronized: batch statistics summed over every replica of every worker
        (``rows``: 0 for padding)."""
        if not self.sync_batchnorm:
            return contextlib.nullcontext()

        def all_sum(values):
            context = tf.distribute.get_replica_context()
            return context.all_reduce(tf.distribute.ReduceOp.SUM, values)

        return batchnorm.across(all_sum, rows)

    def _replica_eval(self, block, i):
        _use_seed_generator(self._seeds)
        model = self.model
        batch = tf.nest.map_structure(lambda a: a[i], block)
        if self._own_test:
            return model.test_step(batch["data"])
        y_pred = self._call(batch["x"], False)
        loss = self._compute_loss(batch, y_pred, False)
        fit_metrics.update(model, batch, y_pred, unscale_loss_for_distribution(loss))

    def _compute_loss(self, batch, y_pred, training: bool):
        """The model's compute_loss on this replica's share, divided by the replicas, its
        per-output loss means counting real examples only."""
        model = self.model
        tracked = [model.metrics_variables[i] for i in self._output_losses]
        before = [tf.identity(v.value) for v in tracked]
        loss = model._compute_loss(
            x=batch["x"],
            y=batch.get("y"),
            y_pred=y_pred,
            sample_weight=fit_metrics.loss_weights(batch, masked=self._masked),
            training=training,
        )
        for var, old in zip(tracked, before):  # several outputs: refused where shared
            var.assign(fit_metrics.reweighted(old, var.value, batch["scale"]))
        # undivided by Keras (_as_one_device), Keras's losses and a compute_loss override's
        # own arithmetic alike (a Distiller's Keras losses were divided twice): divided here
        return loss / self._divisor

    def _unscaled(self, step: str):
        """:func:`_as_one_device` around ``step`` (``train``/``test``)'s calls."""
        if step == "train":
            return _as_one_device(self.model, self.replicas, self._own_train, self._reduce_first)
        return _as_one_device(self.model, self.replicas, self._own_test)

    def _call(self, x, training: bool):
        if self.model._call_has_training_arg:
            return self.model(x, training=training)
        return self.model(x)


def _check_central_state(model) -> None:
    """FitError for state the step writes besides the weights under central storage (a
    layer's seed state: Dropout, noise and augmentation layers; BatchNormalization's moving
    statistics): every replica would write its one shared copy, which TensorFlow refuses
    (an aggregation error from inside the step)."""
    import keras

    written = [v.path for v in model.variables if v.name == "seed_generator_state"]
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization) and layer.built:
            written.append(layer.moving_mean.path)
    if written:
        raise FitError(
            f"{written[0]}: under central storage the step's replicas would each write this "
            "one shared copy (a layer's seed state, or BatchNormalization's moving "
            "statistics), which TensorFlow refuses; train it with --strategy mirrored"
        )
    if isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        raise FitError(
            "fp16's loss scaling under central storage: every replica would write the one "
            "shared loss scale, which TensorFlow refuses; train it with --strategy mirrored, "
            "or in bf16 (no loss scale)"
        )
    if fit_metrics.output_loss_indices(model):
        # Each replica's padding correction of a per-output loss would read the other
        # replicas' updates of the one shared mean (measured: a_loss 1.72711 for 1.72591).
        names = ", ".join(model.output_names)
        raise FitError(
            f"a model of several outputs ({names}) under central storage: its per-output "
            "losses are means that every replica updates in one shared copy, which mirrorfit "
            "cannot correct for a partial batch's padding; train it with --strategy mirrored"
        )


class _ScheduledRunner(coordinated_fit.Scheduled, Runner):
    """The runner under parameter servers (:class:`.coordinated_fit.Scheduled`)."""


def ready(value) -> None:
    """Nothing: TensorFlow's values are on the devices when ``put`` returns."""


def checkpoint_state(runner) -> None:
    """None: ``checkpoint_dir`` writes this engine's state with Keras's ``save_weights`` (the
    variables are whole on every replica)."""
    return None


@contextlib.contextmanager
def _as_one_device(model, replicas: int, own_step: bool, reduced: bool = False):
    """Around a call of the steps (where they are traced): Keras's losses neither divided by
    the replicas nor multiplied back (each replica's loss is the mean over its share, with
    Keras's losses or a ``compute_loss`` of the user's own arithmetic alike: the runner
    divides the total once), and, for a model's own step, every optimizer of the model
    averaging its gradients over the replicas instead of summing them. The update and the
    logged losses are then one device's, for a step written as for one device (a mean loss,
    then ``apply_gradients``; ``super().test_step``). ``reduced``: the step all-reduces the
    gradients itself, every optimizer's own all-reduce passes them on."""
    if replicas == 1:
        yield
        return
    from keras.src.losses import loss as loss_module

    kept = (loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution)
    loss_module.scale_loss_for_distribution = _unchanged
    loss_module.unscale_loss_for_distribution = _unchanged
    optimizers = _optimizers(model) if own_step or reduced else []
    for opt in optimizers:  # past Keras's attribute tracking: not part of the state
        passed = _passed_on if reduced else _averaging(opt, replicas)
        object.__setattr__(opt, "_all_reduce_sum_gradients", passed)
        if not reduced and _clips_itself(opt):  # clipped after the average, not per replica
            object.__setattr__(opt, "_clip_gradients", _unchanged)
    try:
        yield
    finally:
        loss_module.scale_loss_for_distribution = kept[0]
        loss_module.unscale_loss_for_distribution = kept[1]
        for opt in optimizers:
            object.__delattr__(opt, "_all_reduce_sum_gradients")
            if "_clip_gradients" in vars(opt):
                object.__delattr__(opt, "_clip_gradients")


def _unchanged(value):
    return value


def _passed_on(grads_and_vars):
    return list(grads_and_vars)


def _clips_itself(optimizer) -> bool:
    return any(
        getattr(optimizer, n, None) is not None
        for n in ("clipnorm", "clipvalue", "global_clipnorm")
    )


def _clips(optimizer) -> bool:
    """Whether the optimizer (or the one a loss-scale optimizer wraps) clips gradients."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    names = ("clipnorm", "clipvalue", "global_clipnorm")
    return any(getattr(o, n, None) is not None for o in (optimizer, inner) for n in names)


def _check_optimizer(optimizer) -> None:
    """FitError for an optimizer setting TensorFlow's replicas cannot run (a merge_call
    inside Keras's cond, a multi-line RuntimeError)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    name = type(inner).__name__
    if getattr(inner, "use_ema", False):
        raise FitError(
            f"{name}(use_ema=True): TensorFlow's replicas cannot run Keras's EMA update (a "
            "merge_call inside a cond); use backend='jax', which runs it, or drop use_ema"
        )
    if getattr(inner, "gradient_accumulation_steps", None):
        raise FitError(
            f"{name}(gradient_accumulation_steps={inner.gradient_accumulation_steps}): "
            "TensorFlow's replicas cannot run Keras's accumulation (a merge_call inside a "
            "cond); drop it and pass mirrorfit.fit(accum_steps=N) (--accum-steps N), which "
            "accumulates per replica with one all-reduce per step"
        )


def _optimizers(model) -> list:
    """The model's optimizers: the compiled one and any it holds (a GAN's two), with the
    optimizers they wrap (a loss-scale optimizer's inner one)."""
    import keras

    held = list(vars(model).values())
    found = [model.optimizer, *held]
    found += [o for v in held if isinstance(v, (list, tuple)) for o in v]  # a list of them
    found += [getattr(o, "inner_optimizer", None) for o in found]
    unique = {id(o): o for o in found if isinstance(o, keras.optimizers.Optimizer)}
    return list(unique.values())


def _averaging(opt, replicas: int):
    """``opt``'s all-reduce of its gradients, divided by ``replicas``: their mean, clipped
    after it where the optimizer clips (its own clipping, before, is then off)."""
    summing = type(opt)._all_reduce_sum_gradients
    clips = _clips_itself(opt)

    def averaged(grads_and_vars):
        out = []
        for g, v in summing(opt, grads_and_vars):
            if isinstance(g, tf.IndexedSlices):
                g = tf.IndexedSlices(g.values / replicas, g.indices, g.dense_shape)
            elif g is not None:
                g = g / replicas
            out.append((g, v))
        if clips:
            clipped = type(opt)._clip_gradients(opt, [g for g, _ in out])
            out = [(g, v) for g, (_, v) in zip(clipped, out)]
        return out

    return averaged


def _global_seed_generator():
    from keras.src.random.seed_generator import global_seed_generator

    return global_seed_generator()


def _use_seed_generator(generator) -> None:
    """This thread's Keras global seed generator made ``generator``."""
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, generator)


def _no_rebuild_once_built(model) -> None:
    """Keras's own ``evaluate``/``predict`` under a strategy first reduce a batch to a MEAN to
    build the model from it, built or not, and a MEAN of a bool input (KerasHub's
    ``padding_mask``) fails ("Value for attr 'T' of bool"). Once the model, its compiled loss
    and its metrics are built, that build would do nothing: skipped, so Keras's own calls
    keep working after ``mirrorfit.setup``."""
    if "_maybe_symbolic_build" in vars(model):
        return
    keras_build = model._maybe_symbolic_build

    def maybe_symbolic_build(iterator=None, data_batch=None):
        built = all(layer.built for layer in model._flatten_layers()) and all(
            part is None or part.built for part in (model._compile_metrics, model._compile_loss)
        )
        if not built:
            keras_build(iterator=iterator, data_batch=data_batch)

    object.__setattr__(model, "_maybe_symbolic_build", maybe_symbolic_build)


def _python(logs) -> dict | None:
    """A step's logs as Python numbers (arrays as lists; a dict's keys, of compiled metrics,
    flattened), as Keras's fit hands them on."""
    if logs is None:
        return None
    return fit_metrics.pythonified(logs, lambda v: v.numpy())


def _loss_scale_optimizer():
    import keras

    return keras.optimizers.LossScaleOptimizer
