"""``mirrorfit.fit`` and ``mirrorfit.evaluate``: Keras's ``fit`` and ``evaluate`` for a
compiled model, data-parallel over the devices of ``mirrorfit.setup``, on the engine Keras runs
on.

The controller here is Keras's own loop, written over an engine runner that runs S steps a
call (:mod:`mirrorfit.engine.jax.keras_fit`, :mod:`mirrorfit.engine.tensorflow.keras_fit`):
callbacks through Keras's ``CallbackList`` at the same points as Keras's ``fit`` (batch hooks
at execution boundaries), ``model.stop_training`` honoured, the device state written into the
model before every epoch's end and read back after its callbacks (a learning rate a callback
set reaches the next step), validation every ``validation_freq`` epochs, and Keras's
``History`` returned. Every example of every epoch trains, the last partial batch padded
(:mod:`mirrorfit.fitting.batches`) unless ``drop_remainder``.
"""

from __future__ import annotations

import importlib
from typing import Any

from mirrorfit.errors import FitError
from mirrorfit.fitting import batches as fit_batches
from mirrorfit.fitting.blocks import blocks, prefetched
from mirrorfit.fitting.setup import current

_ENGINES = {"tensorflow": "mirrorfit.engine.tensorflow.keras_fit",
            "jax": "mirrorfit.engine.jax.keras_fit"}
DEFAULT_STEPS_PER_EXECUTION = 50  # mirrorfit train's


def fit(model, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
        validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
        sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
        validation_batch_size=None, validation_freq=1, *, steps_per_execution=None,
        accum_steps=1, drop_remainder=False):
    """Train a compiled Keras ``model`` data-parallel, as ``model.fit(...)`` with the same
    keywords would on one device: ``batch_size`` is the global batch. mirrorfit's own:
    ``steps_per_execution`` (steps per compiled call; default the model's compiled one if
    above 1, else 50), ``accum_steps`` (micro-batches per replica per step: one all-reduce
    per step) and ``drop_remainder`` (skip each epoch's last partial batch instead of training
    it). Returns Keras's ``History``; the model's variables hold the trained state."""
    run = _Run(model, steps_per_execution, accum_steps)
    callbacks = _check_callbacks(callbacks)
    _check_int("epochs", epochs, 0)
    _check_int("initial_epoch", initial_epoch, 0)
    _check_int("validation_freq", validation_freq, 1)
    if validation_split and validation_data is None:
        from keras.src.trainers.data_adapters.array_slicing import train_validation_split

        (x, y, sample_weight), validation_data = train_validation_split(
            (x, y, sample_weight), validation_split=validation_split)
    source = fit_batches.adapter(x, y, sample_weight=sample_weight, class_weight=class_weight,
                                 batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                                 shuffle=shuffle)
    epoch_batches = _Epochs(source, batch_size, steps_per_epoch, drop_remainder, run)
    run.build(epoch_batches.first)
    val = None
    if validation_data is not None:
        from keras.src.trainers.data_adapters.data_adapter_utils import (
            unpack_x_y_sample_weight)

        vx, vy, vw = unpack_x_y_sample_weight(validation_data)
        val = fit_batches.adapter(vx, vy, sample_weight=vw,
                                  batch_size=validation_batch_size or batch_size,
                                  steps_per_epoch=validation_steps)
    import keras

    callbacks = keras.callbacks.CallbackList(
        callbacks, add_history=True, add_progbar=verbose != 0,
        verbose=_verbosity(verbose), epochs=epochs, steps=epoch_batches.steps, model=model)
    batch_logs = _wants_batch_logs(callbacks)
    model.stop_training = False
    callbacks.on_train_begin()
    logs: dict[str, float] = {}
    try:
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            callbacks.on_epoch_begin(epoch)
            run.runner.load()  # what a callback changed (a learning rate) reaches the step
            step = 0
            for block in prefetched(blocks(epoch_batches.epoch(), run.steps_per_execution)):
                callbacks.on_train_batch_begin(step)
                run.runner.train(run.runner.put(block.data), block.steps)
                step += block.steps
                callbacks.on_train_batch_end(step - 1, run.runner.logs() if batch_logs else {})
                if model.stop_training:
                    break
            if step == 0:
                raise FitError("the training data gave no batch this epoch; give at least "
                                  "one example (or fewer steps_per_epoch than it holds)")
            logs = run.runner.logs()
            if val is not None and (epoch + 1) % validation_freq == 0:
                val_logs = _evaluate(run, val, validation_batch_size or epoch_batches.size,
                                     validation_steps, callbacks)
                logs.update({f"val_{k}": v for k, v in val_logs.items()})
            run.runner.sync()
            callbacks.on_epoch_end(epoch, logs)
            if model.stop_training:
                break
    finally:
        run.runner.sync()
    callbacks.on_train_end(logs)
    return model.history


def evaluate(model, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
             steps=None, callbacks=None, return_dict=False, *, steps_per_execution=None):
    """``model.evaluate(...)`` data-parallel: every example counted once (a partial last batch
    padded and masked). Returns what Keras's ``evaluate`` returns."""
    import keras

    run = _Run(model, steps_per_execution, 1)
    source = fit_batches.adapter(x, y, sample_weight=sample_weight, batch_size=batch_size,
                                 steps_per_epoch=steps)
    epochs = _Epochs(source, batch_size, steps, False, run, where="evaluation data")
    run.build(epochs.first)
    callbacks = keras.callbacks.CallbackList(
        _check_callbacks(callbacks), add_progbar=verbose != 0, verbose=_verbosity(verbose),
        epochs=1, steps=epochs.steps, model=model)
    logs = _evaluate(run, source, epochs.size, steps, callbacks, epochs=epochs)
    if return_dict:
        return logs
    values = [logs[k] for k in logs]
    return values[0] if len(values) == 1 else values


def _evaluate(run, source, batch_size, steps, callbacks, *, epochs=None) -> dict[str, float]:
    epochs = epochs or _Epochs(source, batch_size, steps, False, run, where="validation data")
    runner = run.runner
    runner.reset_metrics()
    callbacks.on_test_begin()
    step = 0
    for block in prefetched(blocks(epochs.epoch(), run.steps_per_execution)):
        callbacks.on_test_batch_begin(step)
        runner.evaluate(runner.put(block.data), block.steps)
        step += block.steps
        callbacks.on_test_batch_end(step - 1, {})
    if step == 0:
        raise FitError("the validation data gave no batch; give at least one example")
    logs = runner.logs()
    callbacks.on_test_end(logs)
    return logs


class _Run:
    """The model, its engine's runner and the settings of one fit or evaluate."""

    def __init__(self, model, steps_per_execution, accum_steps) -> None:
        import keras

        if not isinstance(model, keras.Model):
            raise FitError(f"mirrorfit.fit takes a keras.Model, not {type(model).__name__}")
        if not getattr(model, "compiled", False) or model.optimizer is None:
            raise FitError("the model is not compiled; call model.compile(optimizer=..., "
                              "loss=..., metrics=[...]) first")
        _check_int("accum_steps", accum_steps, 1)
        if steps_per_execution is None:
            steps_per_execution = (model.steps_per_execution if model.steps_per_execution > 1
                                   else DEFAULT_STEPS_PER_EXECUTION)
        _check_int("steps_per_execution", steps_per_execution, 1)
        self.model, self.steps_per_execution = model, steps_per_execution
        self.accum_steps = accum_steps
        self.backend = keras.backend.backend()
        if self.backend not in _ENGINES:
            raise FitError(f"mirrorfit.fit runs on the tensorflow and jax backends; Keras "
                              f"runs on {self.backend} (set KERAS_BACKEND or mirrorfit.setup)")
        self.engine = importlib.import_module(_ENGINES[self.backend])
        self.runner = None

    @property
    def replicas(self) -> int:
        if self.backend == "tensorflow":
            return self.model.distribute_strategy.num_replicas_in_sync
        return self._placement().replicas

    def _placement(self):
        chosen = current()
        if chosen is not None and chosen.backend == "jax":
            return chosen.placement
        from mirrorfit.engine.jax.devices import configure_devices
        from mirrorfit.engine.jax.placement import build_placement

        return build_placement(configure_devices())

    def build(self, first: dict) -> None:
        """Build the model, its compiled loss and metrics and its optimizer from the first
        batch (as Keras's fit does), then the runner."""
        data = (first["x"], first.get("y"), first["w"])
        if self.backend == "tensorflow":
            strategy = self.model.distribute_strategy
            with strategy.scope():
                self.model._symbolic_build(data_batch=data)
            self.runner = self.engine.Runner(self.model, strategy, accum_steps=self.accum_steps)
        else:
            self.model._symbolic_build(data_batch=data)
            self.runner = self.engine.Runner(self.model, self._placement(),
                                             accum_steps=self.accum_steps)
        self.runner.load()


class _Epochs:
    """One epoch of padded batches at a time from a Keras data adapter; ``first``: the first
    batch (for building), kept for the first epoch."""

    def __init__(self, source, batch_size, steps, drop_remainder, run, *,
                 where: str = "training data") -> None:
        self.source, self.steps_given, self.drop = source, steps, drop_remainder
        self.where = where
        self.steps = steps or source.num_batches
        iterator = self._iterator()
        try:
            first = next(iterator)
        except StopIteration:
            raise FitError(f"the {where} is empty; give at least one example") from None
        self._pending, self._carry = [first], iterator
        self.size = batch_size or source.batch_size or fit_batches.rows(first, where=where)
        fit_batches.check_batch_size(self.size, run.replicas, run.accum_steps)
        self.first = fit_batches.padded(first, self.size, where=where)

    def _iterator(self):
        return iter(self.source.get_numpy_iterator())

    def epoch(self):
        """The padded batches of the next epoch: ``steps`` of them when given, read on from
        where the last epoch stopped (Keras's way; a source that runs out starts over the next
        epoch), else one pass."""
        self.source.on_epoch_begin()
        if not self._pending and (self._carry is None or not self.steps_given):
            self._carry = self._iterator()

        def generate():
            count = 0
            try:
                while not self.steps_given or count < self.steps_given:
                    if self._pending:
                        data = self._pending.pop()
                    else:
                        try:
                            data = next(self._carry)
                        except StopIteration:
                            self._carry = None
                            return
                    count += 1
                    batch = fit_batches.padded(data, self.size, where=self.where)
                    if batch is None or (self.drop and float(batch["scale"][0]) != 1.0):
                        continue
                    yield batch
            finally:
                self.source.on_epoch_end()

        return generate()


def _check_callbacks(callbacks) -> list:
    import keras

    callbacks = list(callbacks or [])
    for cb in callbacks:
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            raise FitError("BackupAndRestore cannot work under mirrorfit.fit (its state is "
                              "on the devices); mirrorfit's own checkpoints do its job: "
                              "mirrorfit train --checkpoint-dir DIR")
        if not isinstance(cb, keras.callbacks.Callback):
            raise FitError(f"callbacks holds {cb!r}, not a keras.callbacks.Callback")
    return callbacks


def _wants_batch_logs(callbacks) -> bool:
    """Whether any callback reads the logs at batch ends (reading them costs a transfer)."""
    from keras.src import utils

    return any(not utils.is_default(cb.on_train_batch_end) or not utils.is_default(
        cb.on_batch_end) for cb in callbacks.callbacks)


def _verbosity(verbose) -> Any:
    return 1 if verbose == "auto" else verbose


def _check_int(name: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FitError(f"{name}={value!r}: give a whole number of at least {minimum}")
