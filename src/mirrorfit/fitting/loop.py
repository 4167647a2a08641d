"""``mirrorfit.fit`` and ``mirrorfit.evaluate``: Keras's ``fit`` and ``evaluate`` for a compiled
model, data-parallel over ``mirrorfit.setup``'s devices, on the engine Keras runs on. Keras's
own loop (``CallbackList``, ``model.stop_training``, ``validation_freq``, Keras's ``History``)
over an engine runner of S steps a call (:mod:`mirrorfit.engine.jax.keras_fit`,
:mod:`mirrorfit.engine.tensorflow.keras_fit`); several workers: :mod:`mirrorfit.fitting.workers`.
(why: docs/architecture.md#the-fit-loop)
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import re
import warnings
from typing import cast

from mirrorfit.engine.backends import ENGINES
from mirrorfit.engine.contract import FitEngine, FitRunner
from mirrorfit.errors import FitError
from mirrorfit.fitting import controller
from mirrorfit.fitting.batches import check_finite, check_targets_given
from mirrorfit.fitting.blocks import prefetched
from mirrorfit.fitting.epochs import Epochs
from mirrorfit.fitting.hooks import callback_list, checked_callbacks
from mirrorfit.fitting.setup import current
from mirrorfit.fitting.workers import Workers

# Each engine's Keras-fit module: engine/<name>/keras_fit.py.
_ENGINES = {name: f"{package}.keras_fit" for name, package in ENGINES.items()}
DEFAULT_STEPS_PER_EXECUTION = 50  # mirrorfit train's


def fit(
    model,
    x=None,
    y=None,
    batch_size=None,
    epochs=1,
    verbose="auto",
    callbacks=None,
    validation_split=0.0,
    validation_data=None,
    shuffle=True,
    class_weight=None,
    sample_weight=None,
    initial_epoch=0,
    steps_per_epoch=None,
    validation_steps=None,
    validation_batch_size=None,
    validation_freq=1,
    *,
    steps_per_execution=None,
    accum_steps=1,
    drop_remainder=False,
    checkpoint_dir=None,
    checkpoint_every=0,
    keep_checkpoints=3,
    fresh=False,
    allow_nan=False,
):
    """Train a compiled Keras ``model`` data-parallel, as ``model.fit(...)`` would on one device
    (``batch_size``: the global batch); plus ``steps_per_execution`` (default the compiled one if
    above 1, else 50), ``accum_steps`` (micro-batches per replica per step), ``drop_remainder``
    (skip each epoch's partial batch), ``checkpoint_dir`` (saved every epoch and every
    ``checkpoint_every`` optimizer steps, the ``keep_checkpoints`` latest kept, resumed by a
    later ``fit``, inside an epoch too; ``fresh``: existing ones moved aside, not resumed),
    ``allow_nan`` (train on through a non-finite loss or weights, as Keras does; by default
    DivergedError). SIGTERM/SIGINT: a checkpoint, then ``mirrorfit.Preempted``. Returns Keras's
    ``History``; the model's variables hold the trained state.
    """
    workers = _workers()
    held = contextlib.ExitStack()  # checkpoint_dir's lock, while this fit writes there
    saver = None
    try:  # what this worker refuses, every worker hears of before anything else
        run = _Run(model, steps_per_execution, accum_steps, workers)
        callbacks = checked_callbacks(callbacks)
        checkpointing = {
            "every": _checked_int("checkpoint_every", checkpoint_every, 0),
            "keep": _checked_int("keep_checkpoints", keep_checkpoints, 1),
            "fresh": _checked_bool("fresh", fresh),
            "allow_nan": _checked_bool("allow_nan", allow_nan),
            "epochs": epochs if type(epochs) is int else None,  # for its resume's line
        }
        if checkpoint_dir is not None:
            saver = _saver(model, checkpoint_dir, checkpointing, workers, held)
            callbacks = [*callbacks, saver.callback]
        elif checkpoint_every or fresh:
            given = "checkpoint_every" if checkpoint_every else "fresh"
            raise FitError(
                f"{given}={checkpoint_every if checkpoint_every else fresh!r} needs a "
                "checkpoint_dir; give one, or leave it out"
            )
        epochs = _checked_int("epochs", epochs, 0)
        drop_remainder = _checked_bool("drop_remainder", drop_remainder)  # "no" is truthy
        initial_epoch = _checked_int("initial_epoch", initial_epoch, 0)
        validation_freq = _checked_int("validation_freq", validation_freq, 1)
        refused = None
    except FitError as e:
        refused = e
    with held:
        workers.start(
            refused,
            _settings(
                epochs=epochs,
                initial_epoch=initial_epoch,
                batch_size=batch_size,
                steps_per_epoch=steps_per_epoch,
                steps_per_execution=steps_per_execution,
                accum_steps=accum_steps,
                validation_split=validation_split,
                validation_data=validation_data is not None,
                validation_steps=validation_steps,
                validation_batch_size=validation_batch_size,
                validation_freq=validation_freq,
                shuffle=shuffle,
                drop_remainder=drop_remainder,
                checkpoint_dir=checkpoint_dir is not None,
                checkpoint_every=checkpoint_every,
                keep_checkpoints=keep_checkpoints,
                fresh=fresh,
                allow_nan=allow_nan,
            ),
        )
        _check_fraction("validation_split", validation_split)
        held_out = None  # where validation_split's rows begin in x
        if validation_split and validation_data is None:
            from keras import tree
            from keras.src.trainers.data_adapters.array_slicing import (
                can_slice_array,
                train_validation_split,
            )

            if not all(can_slice_array(a) for a in tree.flatten((x, y, sample_weight))):
                raise FitError(
                    f"validation_split={validation_split!r} holds out the last rows of arrays; "
                    f"x is a {type(x).__name__}: give validation_data (the held-out examples "
                    "apart), or arrays"
                )
            (x, y, sample_weight), validation_data = train_validation_split(
                (x, y, sample_weight), validation_split=validation_split
            )
            held_out = len(tree.flatten(x)[0])
        check_targets_given(model, x, y)
        y, sample_weight = _as_outputs(model, y), _as_outputs(model, sample_weight)
        adapter = _adapter(x, y, sample_weight, class_weight, batch_size, steps_per_epoch, shuffle)
        if not drop_remainder and run.pads("train"):
            run.leave_padding_out_of_batchnorm(adapter)
            _warn_padding_enters(model, adapter, synced=run.sync_batchnorm)
        train = run.epochs(
            adapter, batch_size, steps_per_epoch, "train", drop_remainder=drop_remainder
        )
        from mirrorfit.fitting import metrics

        metrics.check_input_shapes(model, x, "the training data")  # before the build
        metrics.check_target_shapes(model, y, "the training data")  # which computes a loss
        run.build(train.first, fits=True)
        _warn_batchnorm_per_replica(run, train.size)
        metrics.check_sparse_labels(model, y, "the training data")
        if not checkpointing["allow_nan"]:  # after the labels' own check, which says more
            check_finite(x, y, sample_weight)
        val = _validation(
            run,
            validation_data,
            validation_batch_size or batch_size,
            validation_steps,
            allow_nan=checkpointing["allow_nan"],
            held_out=held_out,
        )
        if saver is not None:
            saver.use(run.engine.checkpoint_state(run.runner))
            saver.set_data(**_what_batches(train, adapter, shuffle, run, x, y))
            _warn_checkpoints_at_calls(saver.every, run.steps_per_execution)
        callbacks, hooks = run.callbacks(callbacks, verbose, epochs, train.steps)
        span = controller.Span(initial_epoch, epochs, validation_freq)
        controller.train(run, train, val, callbacks, hooks, span, saver, allow_nan)
        return model.history


def _saver(model, checkpoint_dir, settings: dict, workers, held):
    """checkpoint_dir's Saver (``settings``: every, keep, fresh, allow_nan), its folder
    checked and (the chief) locked in ``held``."""
    from mirrorfit.artifacts import epoch_checkpoint as checkpoints

    directory = checkpoints.checked_dir(checkpoint_dir, writes=workers.is_chief)
    if workers.is_chief:
        held.enter_context(checkpoints.locked(directory))
    return checkpoints.Saver(
        directory,
        writes=workers.is_chief,
        optimizer=checkpoints.optimizer_settings(model),
        **settings,
    )


def _workers() -> Workers:
    """The workers ``mirrorfit.setup`` joined for Keras's backend (none: this process)."""
    import keras

    chosen = current()
    if chosen is None or chosen.backend != keras.backend.backend():
        return Workers(None)
    return Workers(chosen.distribution)


def _settings(**values) -> dict[str, int]:
    """Arguments as small ints for the workers to compare: a whole number as it is (True 1),
    None :data:`~mirrorfit.fitting.workers.NONE`, anything else a CRC of its repr."""
    import numbers
    import zlib

    from mirrorfit.fitting.workers import NONE

    out = {}
    for name, value in values.items():
        if value is None:
            out[name] = NONE
        elif (
            isinstance(value, numbers.Real)
            and float(value).is_integer()
            and 0 <= float(value) < NONE
        ):
            out[name] = int(float(value))
        else:
            out[name] = zlib.crc32(repr(value).encode()) % NONE
    return out


def _validation(
    run, data, batch_size, steps, *, allow_nan: bool, held_out: int | None = None
) -> Epochs | None:
    """The validation epochs of ``fit``'s ``validation_data``, or None (its NumPy arrays
    checked finite unless ``allow_nan``; ``held_out``: the row of ``x`` where the rows
    ``validation_split`` holds out begin, None: given as ``validation_data``)."""
    if data is None:
        return None
    from keras.src.trainers.data_adapters.data_adapter_utils import unpack_x_y_sample_weight

    from mirrorfit.fitting import metrics

    from mirrorfit.fitting.batches import check_not_ragged

    check_not_ragged("validation_data", data)
    x, y, w = unpack_x_y_sample_weight(data)
    y, w = _as_outputs(run.model, y), _as_outputs(run.model, w)
    metrics.check_input_shapes(run.model, x, "the validation data")
    metrics.check_target_shapes(run.model, y, "the validation data")
    metrics.check_sparse_labels(run.model, y, "the validation data")
    if not allow_nan:
        if held_out is None:
            check_finite(x, y, w, validation="the validation data's ")
        else:
            check_finite(x, y, w, validation="validation_split's rows: ", first_row=held_out)
    adapter = _adapter(x, y, w, None, batch_size, steps, False)
    if run.pads("test"):
        _warn_padding_enters(run.model, adapter, where="validation data")
    return run.epochs(adapter, batch_size, steps, "test", restart=True, where="validation data")


_INPUT_WAIT = "_mirrorfit_input_wait_s"


def input_wait_s(model) -> float:
    """Seconds the training loop waited for input blocks over every ``fit`` of ``model``."""
    return model.__dict__.get(_INPUT_WAIT, 0.0)


def runner_of(model):
    """The engine runner the last ``fit`` or ``evaluate`` of ``model`` used; None before."""
    cached = model.__dict__.get("_mirrorfit_runner")
    return None if cached is None else cached[1]


def evaluate(
    model,
    x=None,
    y=None,
    batch_size=None,
    verbose="auto",
    sample_weight=None,
    steps=None,
    callbacks=None,
    return_dict=False,
    *,
    steps_per_execution=None,
):
    """``model.evaluate(...)`` data-parallel: every example counted once (a partial last batch
    padded and masked). Returns what Keras's ``evaluate`` returns."""
    workers = _workers()
    try:
        run = _Run(model, steps_per_execution, 1, workers)
        refused = None
    except FitError as e:
        refused = e
    workers.start(
        refused,
        _settings(batch_size=batch_size, steps=steps, steps_per_execution=steps_per_execution),
    )
    from mirrorfit.fitting import metrics

    check_targets_given(model, x, y)
    y, sample_weight = _as_outputs(model, y), _as_outputs(model, sample_weight)
    adapter = _adapter(x, y, sample_weight, None, batch_size, steps, False)
    if run.pads("test"):
        _warn_padding_enters(model, adapter, where="evaluation data")
    data = run.epochs(
        adapter,
        batch_size,
        steps,
        "test",
        where="evaluation data",
    )
    metrics.check_input_shapes(model, x, "the evaluation data")
    metrics.check_target_shapes(model, y, "the evaluation data")
    run.build(data.first)
    metrics.check_sparse_labels(model, y, "the evaluation data")
    run.from_chief()
    callbacks, hooks = run.callbacks(
        checked_callbacks(callbacks), verbose, 1, data.steps, history=False
    )
    logs = controller.evaluate(run, data, callbacks, hooks)
    if return_dict:
        return dict(sorted(logs.items()))  # as Keras's pythonify_logs orders them
    return model._flatten_metrics_in_order(logs)  # Keras's order: metrics_names, then sorted


def _as_outputs(model, part):
    from mirrorfit.fitting.metrics import as_outputs

    return as_outputs(model, part)


def _adapter(x, y, sample_weight, class_weight, batch_size, steps, shuffle):
    """Keras's data adapter for what ``fit`` was given (its own checks and messages)."""
    import numpy as np
    from keras import tree
    from keras.src.trainers.data_adapters import get_data_adapter

    from mirrorfit.fitting.batches import check_arrays, check_not_ragged

    for name, part in (("x", x), ("y", y), ("sample_weight", sample_weight)):
        check_not_ragged(name, part)
        if any(isinstance(a, np.ndarray) and a.dtype == object for a in tree.flatten(part)):
            raise FitError(
                f"{name} holds an array of Python objects (dtype object, e.g. "
                "strings); give numeric arrays (tokenise text first, or pass a "
                "tf.data.Dataset of strings to a model that takes them)"
            )
    if x is None:
        raise FitError(
            "x=None: give the inputs (arrays, a dict of them, a tf.data.Dataset, a generator "
            "or a keras.utils.PyDataset)"
        )
    check_arrays(x, y, sample_weight)
    from mirrorfit.fitting.metrics import check_class_weight

    check_class_weight(class_weight, y)
    if steps is not None:
        steps = _checked_int("steps_per_epoch / validation_steps / steps", steps, 1)
    if batch_size is not None:
        batch_size = _checked_int("batch_size", batch_size, 1)
    return get_data_adapter(
        x=x,
        y=y,
        sample_weight=sample_weight,
        batch_size=batch_size,
        steps_per_epoch=steps,
        shuffle=shuffle,
        class_weight=class_weight,
    )


class _Run:
    """The model, its engine and runner, and the settings of one fit or evaluate."""

    def __init__(self, model, steps_per_execution, accum_steps, workers: Workers) -> None:
        import keras

        if not isinstance(model, keras.Model):
            raise FitError(f"mirrorfit.fit takes a keras.Model, not {type(model).__name__}")
        if not getattr(model, "compiled", False) or model.optimizer is None:
            raise FitError(
                "the model is not compiled; call model.compile(optimizer=..., "
                "loss=..., metrics=[...]) first"
            )
        self.accum_steps = _checked_int("accum_steps", accum_steps, 1)
        if steps_per_execution is None:
            steps_per_execution = (
                model.steps_per_execution
                if model.steps_per_execution > 1
                else DEFAULT_STEPS_PER_EXECUTION
            )
        self.steps_per_execution = _checked_int("steps_per_execution", steps_per_execution, 1)
        self.model = model
        self.backend = keras.backend.backend()
        if self.backend not in _ENGINES:
            raise FitError(
                f"mirrorfit.fit runs on the {' and '.join(_ENGINES)} backends; "
                f"Keras runs on {self.backend} (set KERAS_BACKEND or "
                "mirrorfit.setup)"
            )
        self.engine = cast(FitEngine, importlib.import_module(_ENGINES[self.backend]))
        chosen = current()
        chosen = chosen if chosen is not None and chosen.backend == self.backend else None
        # Where the engine runs the model (None: the engine's own default), and the workers
        # it spans (None: this process alone).
        self.placement = self.engine.placement(model, chosen)
        self.sync_batchnorm = bool(chosen is not None and chosen.sync_batchnorm)
        self.workers = workers
        self.engine.check_model(model, self.placement, workers.distribution)
        self.runner: FitRunner = cast(FitRunner, None)  # the engine's, built by build()

    def from_chief(self) -> None:
        """Several workers: the model's and optimizer's state made the chief's on every one
        (a worker may have changed its own: a restore, ``set_weights``)."""
        if self.workers.count > 1:
            self.runner.from_chief(self.workers.distribution)

    def callbacks(self, callbacks: list, verbose, epochs: int, steps, *, history: bool = True):
        """Keras's ``CallbackList`` for this worker, run in the engine's callback context, and
        the batch hooks (:func:`mirrorfit.fitting.hooks.callback_list`)."""
        return callback_list(
            self.model,
            callbacks,
            self.runner,
            self.workers,
            lambda: self.engine.callback_context(self.placement),
            verbose=verbose,
            epochs=epochs,
            steps=steps,
            history=history,
        )

    def agreed(self, blocks, *, train: bool = False):
        """``blocks`` made ahead on a thread; on several workers, checked to agree. ``train``:
        the time the loop waits for them counts in :func:`input_wait_s`."""
        return self.workers.agreed(prefetched(blocks, on_wait=self._waited if train else None))

    def _waited(self, seconds: float) -> None:
        held = self.model.__dict__
        held[_INPUT_WAIT] = held.get(_INPUT_WAIT, 0.0) + seconds

    def leave_padding_out_of_batchnorm(self, adapter) -> None:
        """On one replica, where an epoch ends on a partial batch: BatchNormalization's
        moments over its real rows, as Keras's fit on one device computes them over the short
        batch (the synchronized computation over one replica, which leaves the padding out;
        a Keras user measured a BatchNormalization model 0.16 from its own fit without it).
        Not under the model's jit_compile where the engine cannot synchronize there."""
        from mirrorfit.engine import backends
        from mirrorfit.fitting import batchnorm

        try:
            partial = adapter.partial_batch_size
        except NotImplementedError:  # a generator's last batch is not known ahead
            return
        if (
            partial
            and not self.sync_batchnorm
            and self.engine.replicas(self.placement) == 1
            and (
                not self.model.jit_compile
                or backends.capabilities(self.backend).syncs_batchnorm_under_xla
            )
            and batchnorm.per_replica(self.model)
        ):
            self.sync_batchnorm = True

    def pads(self, step: str) -> bool:
        """Whether ``step``'s batches are padded (the engine's choice of runner decides,
        one for both steps: the run's micro-batches count for evaluation too)."""
        return self.engine.pads(self.model, step, self.placement, self.accum_steps)

    def epochs(self, source, batch_size, steps, step: str, **kwargs) -> Epochs:
        """The epochs of ``source`` as the runner takes them (``step``: ``train`` or
        ``test``: padded, unless the model's own ``train_step``/``test_step`` runs)."""
        from mirrorfit.fitting.metrics import masked_outputs

        accum = self.accum_steps if step == "train" else 1
        return Epochs(
            source,
            batch_size,
            steps,
            replicas=self.engine.replicas(self.placement),
            accum_steps=accum,
            pad=self.pads(step),
            zeros=masked_outputs(self.model),
            round_up=step == "test",
            read_again=self.engine.READ_AGAIN,
            **kwargs,
        )

    def build(self, first: dict, *, fits: bool = False) -> None:
        """Build the model, its compiled loss and metrics and its optimizer from the first
        batch (as Keras's fit does), then the runner (``fits``: to train: refused where the
        trainable weights changed since the compile; evaluating makes a runner anew)."""
        model = self.model
        data = first["data"] if "data" in first else (first["x"], first.get("y"), first["w"])
        with self.engine.scope(self.placement), _shape_refused():
            try:
                model._symbolic_build(data_batch=data)
            except RuntimeError as e:
                if not _without_call(model, e):
                    raise
                # A model with its own train_step and no call() (keras-io's DCGAN): its step
                # calls its parts, built already; Keras's own fit on one device never builds
                # it either.
                model.built = True
        # One runner per model and compile: its compiled calls are kept for the next fit or
        # evaluate (Keras keeps its train_function the same way); a new compile() makes anew.
        key = (
            id(self.placement),
            self.accum_steps,
            bool(model.jit_compile),
            self.sync_batchnorm,
            id(model.optimizer),
            id(model._compile_loss),
            id(model._compile_metrics),
        )
        warn_compiled_anyway(model)
        cached = model.__dict__.get("_mirrorfit_runner")
        trainable = tuple(id(v) for v in model.trainable_variables)
        if fits:
            _check_optimizer_built_for(model)
        if cached is not None and cached[0] == key and cached[2] == trainable:
            self.runner = cached[1]
        else:
            self.runner = self.engine.runner(
                model,
                self.placement,
                accum_steps=self.accum_steps,
                jit_compile=bool(model.jit_compile),  # Keras's "auto": on where a GPU is
                sync_batchnorm=self.sync_batchnorm,
                sample=first.get("x"),
            )
            # Past Keras's attribute tracking: the runner is not part of the model's state.
            object.__setattr__(model, "_mirrorfit_runner", (key, self.runner, trainable))
            from mirrorfit.fitting.metrics import ignores_a_class, masked_outputs

            _warn_own_metrics(model, self.runner)
            if masked_outputs(model) or ignores_a_class(model):
                warnings.warn(
                    "the model's outputs are masked (mask_zero, Masking, a loss's "
                    "ignore_class): its loss is averaged over each replica's counted "
                    "steps, then over the replicas, as under Keras's own strategies, "
                    "not over the whole global batch's (a partial last batch is off "
                    "by up to a few percent)",
                    stacklevel=3,
                )
        self.runner.load()

    def synced_after(self):
        """Around the epochs: the device state into the model at the end (and the optimizer's
        final values, e.g. its EMA weights), without hiding an error the epochs raised."""
        import contextlib

        run = self

        @contextlib.contextmanager
        def around():
            try:
                yield
            except BaseException:
                try:
                    run.runner.sync()
                except Exception:  # noqa: BLE001 - the epochs' own error is the one to see
                    pass
                raise
            run.runner.sync()
            run.model.optimizer.finalize_variable_values(run.model.trainable_weights)

        return around()


def _without_call(model, error: RuntimeError) -> bool:
    """Whether Keras's build failed because ``model`` has no ``call()`` and runs its own
    ``train_step``, which does not need one."""
    from mirrorfit.fitting.metrics import overrides

    return isinstance(error.__context__, NotImplementedError) and overrides(model, "train_step")


@contextlib.contextmanager
def _shape_refused():
    """Keras's refusal of data the model's input does not take (its input spec), as one
    FitError line; any other error of the model's own code goes through whole."""
    try:
        yield
    except ValueError as e:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # Keras's bold
        said = [ln.strip() for ln in text.splitlines() if "incompatible shape" in ln]
        if not said:
            raise
        raise FitError(
            f"the model cannot take the training data: {said[0][:300]}; give data of the "
            "model's input shape, or a model built for the data"
        ) from None


def _warn_own_metrics(model, runner) -> None:
    """Warn where a compiled metric of the user's own class is updated per replica, its
    state then added up over the replicas (a model's own step on JAX sees the global batch)."""
    from mirrorfit.fitting.metrics import own_metric_names

    names = own_metric_names(model)
    if names and getattr(runner, "per_replica", True) and runner.replicas > 1:
        warnings.warn(
            f"the metric {names[0]}{' (and others)' if len(names) > 1 else ''} is a class of "
            "your own: each replica updates it on its share and the replicas' changes to its "
            "state are added up (as under Keras's own strategies), right for sums and counts, "
            "not for a maximum or a last value; compute those in a callback over predict",
            stacklevel=4,
        )


def warn_compiled_anyway(model) -> None:
    """Warn where the model asks for eager steps (``run_eagerly=True``): mirrorfit compiles
    every step over the replicas all the same."""
    if getattr(model, "run_eagerly", False):
        warnings.warn(
            "model.run_eagerly=True: mirrorfit compiles every step all the same (one program "
            "over the replicas), so Python in call() or a step runs once, at tracing; to step "
            "through it eagerly, use the model's own fit/predict on one device",
            stacklevel=3,
        )


def _warn_batchnorm_per_replica(run, batch_size: int) -> None:
    """Warn where BatchNormalization's batch statistics are each replica's share's, not the
    global batch's as on one device (``sync_batchnorm`` off, several replicas)."""
    from mirrorfit.fitting import batchnorm

    replicas = run.engine.replicas(run.placement)
    if replicas == 1 or run.sync_batchnorm or not getattr(run.runner, "per_replica", True):
        return
    names = [layer.name for layer in batchnorm.per_replica(run.model)]
    if names:
        share = batch_size // (replicas * run.accum_steps)
        warnings.warn(
            f"BatchNormalization ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) "
            f"computes its batch statistics over each replica's {share} examples, not the "
            f"global batch of {batch_size} as on one device; mirrorfit.setup("
            "sync_batchnorm=True) (mirrorfit train --sync-batchnorm) computes them over "
            "every replica",
            stacklevel=3,
        )


def _warn_padding_enters(model, adapter, *, synced: bool = False, where: str = "") -> None:
    """Warn where the padding of an epoch's partial last batch reaches what the loss and
    metrics' zero weights do not cover: batch statistics (training), activity losses, a
    ``compute_loss`` override that ignores ``sample_weight``. Only where the adapter knows
    its last batch (arrays); a generator's is not known ahead. ``where``: the evaluation or
    validation data (no statistics, no drop_remainder), else the training data."""
    import keras

    try:
        real = adapter.partial_batch_size
    except NotImplementedError:
        return
    if not real:
        return
    layers = list(model._flatten_layers(include_self=False, recursive=True))
    what = sorted(
        {
            "BatchNormalization's statistics"
            for layer in layers
            if isinstance(layer, keras.layers.BatchNormalization)
            and layer.trainable  # a frozen one normalises with its moving statistics
            and not synced
            and not where  # evaluation normalises with the moving statistics
        }
        | {
            "activity regularizers"
            for layer in layers
            if getattr(layer, "activity_regularizer", None) is not None
        }
    )
    from mirrorfit.fitting.metrics import masked_outputs, overrides

    if overrides(model, "compute_loss"):  # Keras's own losses weigh by sample_weight
        what.append("the model's compute_loss unless it weighs by sample_weight")
    if what:
        fill = "zeros" if masked_outputs(model) else "copies of its last example"
        ending = (
            f"the {where} ends on a partial batch"
            if where
            else "each epoch ends on a partial batch"
        )
        way = (
            "a batch size that divides the data scores whole batches only"
            if where
            else "pass drop_remainder=True, or a batch size that divides the data, to train "
            "on whole batches only"
        )
        warnings.warn(
            f"{ending} of {real} examples, padded to the global batch with {fill}, which "
            f"reach {' and '.join(what)} (the loss and metrics weigh them 0); {way}",
            stacklevel=3,
        )


def _what_batches(train: Epochs, adapter, shuffle, run, x, y) -> dict:
    """What fixes an epoch's batches, for a resume inside one: the global batch, the steps,
    the shuffle, the micro-batches, the examples and (NumPy arrays) a hash of their bytes."""
    import numpy as np
    from keras import tree

    leaves = [a for a in tree.flatten((x, y)) if a is not None]
    arrays = bool(leaves) and all(isinstance(a, np.ndarray) for a in leaves)
    data = {
        "batch_size": train.size,
        "steps_per_epoch": train.steps,
        "shuffle": shuffle,
        "accum_steps": run.accum_steps,
        "examples": getattr(adapter, "_num_samples", None),
    }
    if arrays:  # ~0.1 s for MNIST's 47 MB, once per fit with a checkpoint_dir
        from mirrorfit.data.pipeline import fingerprint

        data["data"] = fingerprint(*leaves)
    return data


def _warn_checkpoints_at_calls(every: int, steps_per_execution: int) -> None:
    """checkpoint_every below steps_per_execution: checkpoints come at call boundaries only."""
    if every and every < steps_per_execution:
        warnings.warn(
            f"checkpoint_every={every} is below steps_per_execution={steps_per_execution}: "
            "a checkpoint is written at the end of a call of steps, so every "
            f"{steps_per_execution} steps at most often; pass steps_per_execution={every} "
            "for checkpoints that often",
            stacklevel=3,
        )


def _check_optimizer_built_for(model) -> None:
    """FitError where the model's trainable weights are not those its optimizer was built for
    (a layer's ``trainable`` set after a fit, without a compile with a new optimizer): its
    slots would update other weights, or none."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not optimizer.built:
        return
    then, now = list(optimizer._trainable_variables), list(model.trainable_variables)
    if [id(v) for v in then] == [id(v) for v in now]:
        return
    held = {id(v) for v in then}
    added = [v for v in now if id(v) not in held]
    change = f"{added[0].path} trains now" if added else f"{_gone(then, now).path} no longer trains"
    raise FitError(
        f"the model's trainable weights are not those its optimizer was built for ({change}: "
        "a layer's trainable set after it trained); compile the model again with a new "
        "optimizer, e.g. model.compile(optimizer=keras.optimizers.Adam(1e-5), ...), as Keras "
        "needs for the change to apply"
    )


def _gone(then: list, now: list):
    """The first of ``then`` not in ``now`` (or out of its place there)."""
    held = {id(v) for v in now}
    missing = [v for v in then if id(v) not in held]
    return missing[0] if missing else then[0]


def _check_fraction(name: str, value) -> None:
    """FitError unless ``value`` is a fraction in [0, 1) (Keras's split takes 1.5 as well)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < 1:
        raise FitError(f"{name}={value!r}: give a fraction of the data, at least 0 and below 1")


def _checked_bool(name: str, value) -> bool:
    """``value`` if it is a bool (NumPy's too); FitError for anything else (a string "no")."""
    import numpy as np

    if not isinstance(value, (bool, np.bool_)):
        raise FitError(f"{name}={value!r}: give True or False")
    return bool(value)


def _checked_int(name: str, value, minimum: int) -> int:
    """``value`` as an int (NumPy integers too); FitError for anything else or below
    ``minimum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise FitError(f"{name}={value!r}: give a whole number of at least {minimum}") from None
    if value < minimum:
        raise FitError(f"{name}={value!r}: give a whole number of at least {minimum}")
    return value
