"""``fit``'s controller: the epochs over the engine runner's calls of S steps, as Keras's ``fit``
runs them (callbacks, validation, ``stop_training``), with the position a checkpoint keeps
(epochs done, steps into the next, the shuffle's generator), checkpoints every N steps and at
epoch ends, a resume from inside an epoch, and the guards between calls (a signal, a
non-finite loss or weight). (why: docs/keras-script.md#preemption-and-divergence)
"""

from __future__ import annotations

from dataclasses import dataclass

from mirrorfit.errors import FitError
from mirrorfit.fitting.epochs import Epochs
from mirrorfit.fitting.guards import Divergence, Signals, memory_noted, preempted


@dataclass(frozen=True)
class Span:
    """The epochs to run: ``initial_epoch`` up to ``epochs``, validating every ``freq``."""

    initial_epoch: int
    epochs: int
    freq: int


def train(run, data: Epochs, val, callbacks, hooks, span: Span, saver, allow_nan: bool) -> None:
    """Train ``run``'s model over ``data``'s epochs; ``saver``: the checkpoint_dir's
    :class:`~mirrorfit.artifacts.epoch_checkpoint.Saver`, or None."""
    model, workers = run.model, run.workers
    model.stop_training = False
    guard = Divergence(
        allow_nan, lambda: saver.last if saver is not None else None, every_call=workers.count > 1
    )
    try:
        with memory_noted(data.size, run.backend):
            _train(run, data, val, callbacks, hooks, span, saver, guard)
    finally:  # a checkpoint still committing in the background ends before fit returns
        if saver is not None:
            saver.join()


def _train(run, data: Epochs, val, callbacks, hooks, span: Span, saver, guard) -> None:
    model, workers = run.model, run.workers
    with Signals() as signals:
        if saver is not None:
            saver.begin(lambda: workers.agree(False))
        callbacks.on_train_begin()
        # BackupAndRestore or checkpoint_dir restored an epoch's state (its weights reach the
        # devices at the epoch's start); Keras's fit starts there too, checkpoint_dir inside
        # the epoch where it was saved there.
        restored = saver.restored if saver is not None else None
        start = restored.epoch if restored is not None else None
        backed_up = model._initial_epoch  # BackupAndRestore's
        if start is None:  # BackupAndRestore's, or fit's own (Keras's fit: the same `or`)
            start = model._initial_epoch or span.initial_epoch
        start = workers.same_epoch(start)
        if restored is not None or backed_up:  # a resume; fit's initial_epoch reads as Keras's
            data.resume_at(start)
        skip = restored.step if restored is not None else 0
        model._initial_epoch = None  # for this fit only
        run.from_chief()  # several workers: every one starts from the chief's state
        guard.updates_begin(model, resumed=restored is not None and bool(restored.epoch or skip))
        logs: dict[str, float] = {}
        with run.synced_after():
            for epoch in range(start, span.epochs):
                logs = _epoch(run, data, callbacks, hooks, (epoch, skip), saver, guard, signals)
                skip = 0
                if val is not None and (epoch + 1) % span.freq == 0:
                    val_logs = evaluate(run, val, callbacks, hooks)
                    logs.update({f"val_{k}": v for k, v in val_logs.items()})
                run.runner.sync()
                guard.check_weights(model, epoch, logs.get("loss"))
                callbacks.on_epoch_end(epoch, logs)
                if epoch + 1 < span.epochs:  # after the last, training has ended: it returns
                    _stop_on_signal(run, signals, saver, epoch + 1, 0, saved=True)
                model.stop_training = workers.agree(model.stop_training)
                if model.stop_training:
                    break
        if saver is not None:
            saver.wait()  # the last checkpoint, committed (it may write in the background)
        guard.check_updates(model)
    callbacks.on_train_end(logs)


def _epoch(run, data: Epochs, callbacks, hooks, at, saver, guard, signals) -> dict[str, float]:
    """One training epoch ``at`` = (epoch, steps already trained), its batch hooks at call
    boundaries, the guards and checkpoints after each call; the epoch's merged logs."""
    model, runner = run.model, run.runner
    epoch, step = at
    model.reset_metrics()
    # Resumed inside the epoch: the checkpoint's learning rate already holds what this epoch's
    # on_epoch_begin set (and its batch callbacks since); a schedule of the current rate
    # (LearningRateScheduler(lambda e, lr: lr * 0.5)) would apply twice. Its callbacks run
    # as in the first try, and the rate is the checkpoint's again after them.
    held = _held_rate(model) if step else None
    callbacks.on_epoch_begin(epoch)
    if held is not None:
        held[0].assign(held[1])
    runner.load()  # what a callback changed (a learning rate) reaches the step
    if saver is not None:
        saver.epoch_begins()  # before the epoch draws its shuffle
    trained = False
    for block in run.agreed(data.blocks(run.steps_per_execution, skip=step), train=True):
        hooks.call(callbacks.on_train_batch_begin, step)
        runner.train(runner.put(block.data), block.steps)
        step, trained = step + block.steps, True
        guard.steps += block.steps
        guard.after_call(runner, epoch, step)
        logs = hooks.logs("train")
        last = data.steps is not None and step >= data.steps
        if saver is not None and saver.due(block.steps, last):
            guard.check_now(runner, epoch, step)  # never a checkpoint of a diverged step
            runner.sync()
            saver.save(model, saver.position(epoch, step))
        hooks.call(callbacks.on_train_batch_end, step - 1, logs=logs)
        if not last:
            _stop_on_signal(run, signals, saver, epoch, step, saved=False, guard=guard)
        model.stop_training = run.workers.agree(model.stop_training)
        if model.stop_training:
            break
    if trained:
        guard.check_now(runner, epoch, step)
    if not trained and step == 0:
        raise FitError(
            "the training data gave no batch this epoch; give at least "
            "one example (or fewer steps_per_epoch than it holds)"
        )
    return runner.logs()


def _held_rate(model):
    """(the optimizer's learning-rate variable, its value now), None where the rate is a
    schedule or a function of the step, which no callback sets."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # LossScaleOptimizer's
    rate = getattr(optimizer, "_learning_rate", None)
    if not isinstance(rate, keras.Variable):
        return None
    return rate, keras.ops.convert_to_numpy(rate)


def _stop_on_signal(
    run, signals: Signals, saver, epoch: int, step: int, *, saved: bool, guard=None
) -> None:
    """After a signal on any worker: a checkpoint at (``epoch``, ``step``) unless ``saved``
    there already (an epoch's end), then :class:`Preempted` on every worker."""
    if not run.workers.agree(signals.name is not None):
        return
    path = None
    if saver is not None:
        if saved:
            path = saver.last
        else:
            if guard is not None:
                guard.check_now(run.runner, epoch, step)
            run.runner.sync()
            path = saver.save(run.model, saver.position(epoch, step))
        saver.wait()  # committed before the rerun looks for it
    raise preempted(signals.name or "another worker's signal", path, epoch, step)


def evaluate(run, data: Epochs, callbacks, hooks) -> dict[str, float]:
    """One pass of ``data`` through the runner's evaluation, with the test callbacks."""
    runner = run.runner
    runner.reset_metrics()
    hooks.edge(callbacks.on_test_begin)
    step = 0
    for block in run.agreed(data.blocks(run.steps_per_execution)):
        hooks.call(callbacks.on_test_batch_begin, step)
        runner.evaluate(runner.put(block.data), block.steps)
        step += block.steps
        hooks.call(callbacks.on_test_batch_end, step - 1, logs=hooks.logs("test"))
    if step == 0:
        raise FitError(f"the {data.where} gave no batch; give at least one example")
    logs = runner.logs()
    hooks.edge(callbacks.on_test_end, logs)
    return logs
