"""Keras callbacks under ``mirrorfit.fit``: the ``CallbackList`` each worker runs, its hooks in
the engine's callback context, and the device state synced around the hooks that read or
change the model (:class:`BatchHooks`)."""

from __future__ import annotations

from typing import Any

from mirrorfit.errors import FitError


def callback_list(
    model, callbacks: list, runner, workers, context, *, verbose, epochs, steps, history=True
):
    """(Keras's ``CallbackList`` for this worker with its hooks run in ``context()``, the
    :class:`BatchHooks`). The hooks are decided from every worker's list alike: their reads
    of the devices are collectives. Off the chief, Keras's writers and the progress bar are
    left out (:meth:`mirrorfit.fitting.workers.Workers.on_this_worker`)."""
    import keras

    def made(chosen, progbar):
        return keras.callbacks.CallbackList(
            chosen,
            add_history=history,
            add_progbar=progbar,
            verbose=_verbosity(verbose),
            epochs=epochs,
            steps=steps,
            model=model,
        )

    every = made(callbacks, verbose != 0)
    hooks = BatchHooks(every, runner)
    mine = every if workers.is_chief else made(workers.on_this_worker(callbacks), False)
    return _InContext(mine, context), hooks


class _InContext:
    """A ``CallbackList`` whose ``on_*`` hooks run inside ``context()`` (the engine's)."""

    def __init__(self, callbacks, context) -> None:
        self._callbacks, self._context = callbacks, context

    def __getattr__(self, name: str):
        value = getattr(self._callbacks, name)
        if not name.startswith("on_"):
            return value

        def hook(*args, **kwargs):
            with self._context():
                return value(*args, **kwargs)

        return hook


class BatchHooks:
    """Batch callbacks at call boundaries (and the edges of an evaluation). Where a callback of
    the user's has batch hooks, the device state is written into the model before them and read
    back after (a callback may read the weights, save the model or set the learning rate);
    logs are read only where a callback reads them (each read is a transfer from the
    devices)."""

    def __init__(self, callbacks, runner) -> None:
        import keras
        from keras.src import utils

        def has(cb, names):
            return any(not utils.is_default(getattr(cb, n)) for n in names)

        # Keras's own that read only the logs (TerminateOnNaN too): no sync for them.
        keras_own = (
            keras.callbacks.ProgbarLogger,
            keras.callbacks.History,
            keras.callbacks.TerminateOnNaN,
        )
        train = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
        test = ("on_test_batch_begin", "on_test_batch_end")
        users = [cb for cb in callbacks.callbacks if not isinstance(cb, keras_own)]
        self._sync = any(has(cb, train + test) for cb in users)
        # SwapEMAWeights swaps the weights the evaluation uses in on_test_begin (back: _end)
        self._edges = any(has(cb, ("on_test_begin", "on_test_end")) for cb in users)
        self._reads = {
            "train": any(has(cb, train[1::2]) for cb in callbacks.callbacks),
            "test": any(has(cb, test[1:]) for cb in callbacks.callbacks),
        }
        self.runner = runner

    def logs(self, step: str) -> dict[str, float]:
        return self.runner.logs() if self._reads[step] else {}

    def call(self, hook, *args, **kwargs) -> None:
        self._around(self._sync, hook, *args, **kwargs)

    def edge(self, hook, *args, **kwargs) -> None:
        """``on_test_begin``/``on_test_end``, synced the same way where a callback has them."""
        self._around(self._edges, hook, *args, **kwargs)

    def _around(self, sync: bool, hook, *args, **kwargs) -> None:
        if sync:
            self.runner.sync()
        hook(*args, **kwargs)
        if sync:
            self.runner.reload()


def checked_callbacks(callbacks) -> list:
    """``callbacks`` (None, or a nested list) flat; FitError for anything not a Callback."""
    import keras
    from keras import tree

    callbacks = tree.flatten(callbacks) if callbacks is not None else []
    for cb in callbacks:
        if not isinstance(cb, keras.callbacks.Callback):
            raise FitError(f"callbacks holds {cb!r}, not a keras.callbacks.Callback")
    return callbacks


def _verbosity(verbose) -> Any:
    return 1 if verbose == "auto" else verbose
