"""``mirrorfit train --model package.module:function`` with a compiled Keras model (or an
uncompiled one with ``--loss``), trained as compiled through ``mirrorfit.fit`` on the data as
given: MNIST's uint8 pixels and integer labels, a ``.npz``'s arrays (``x_train``, ``y_train``;
optional ``sample_weight_train``, ``x_val``/``y_val``, ``x_test``/``y_test``; ``x_train/NAME``
members make a dict of inputs, likewise targets) or a ``--data`` function's splits as Keras's
``fit`` takes them. Flags only the built-in loop has are refused, one line each.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import numpy as np

from mirrorfit.config import TrainConfig
from mirrorfit.errors import ConfigError

# Settings of mirrorfit's own loop that do not reach a compiled model, why, and the way round.
_NOT_APPLIED = {
    "export_dir": "its SavedModel signature is the built-in models' (images -> probabilities); "
    "use --save-keras, then the model's own export()",
    "profile": "it measures the built-in loop's parts, not yet mirrorfit.fit's; use "
    "mirrorfit bench --model",
    "xla": "mirrorfit.fit's TensorFlow step is not XLA-compiled yet; use --backend jax, which "
    "compiles every step",
    "remat": "it wraps the built-in models' layers, not yet a compiled model's; use the "
    "default loop (an uncompiled model)",
    "warmup_epochs": "the compiled optimizer's learning rate wins; give a schedule in the "
    "model's compile()",
    "cache": "the data are the arrays the source gives, already in memory; return a cached "
    "tf.data.Dataset from a --data function",
}


def wanted(config: TrainConfig, model) -> bool:
    """Whether a built ``--model`` goes this way: compiled, or ``--loss`` given."""
    return bool(getattr(model, "compiled", False)) or config.loss is not None


def check(config: TrainConfig, engine) -> None:
    """One line for a flag this path cannot honour (before anything trains)."""
    defaults = TrainConfig.__dataclass_fields__
    for name, why in _NOT_APPLIED.items():
        if name == "xla" and engine.COMPILES_EVERY_STEP:
            continue  # XLA compiles every step already
        if getattr(config, name) != defaults[name].default:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} does not apply to a compiled --model (trained through "
                f"mirrorfit.fit): {why}"
            )
    if config.strategy == "parameter-server":
        raise ConfigError(
            "--strategy parameter-server is not supported with a compiled --model "
            "(trained through mirrorfit.fit); use --strategy multi-worker"
        )
    if config.strategy == "central-storage":
        # Keras's train step updates the metrics in each replica; a central-storage metric is
        # one variable, and Keras's assign_add (an assign of v + x) summed over the replicas
        # doubles it every step (the loss read inf, then NaN).
        raise ConfigError(
            "--strategy central-storage is not supported with a compiled "
            "--model: Keras's own train step would double its metrics every step;"
            " use --strategy mirrored"
        )


def compile_uncompiled(config: TrainConfig, model, optimizer) -> None:
    """``--loss`` and ``--metrics`` with ``--optimizer``/``--lr`` for a model not compiled."""
    metrics = [m for m in (config.metrics or "").split(",") if m]
    try:
        model.compile(optimizer=optimizer, loss=config.loss, metrics=metrics)
    except (ValueError, TypeError) as e:
        raise ConfigError(
            f"--loss {config.loss} / --metrics {config.metrics}: Keras refused "
            f"them ({str(e).strip().splitlines()[0][:200]})"
        ) from None


def describe(config: TrainConfig, model, compiled: bool) -> str:
    """What trains, for the start screen: ``loss: mse (the model's compile), ...``."""
    import keras

    opt = model.optimizer
    lr = opt.learning_rate
    rate = f"{float(keras.ops.convert_to_numpy(lr)):g}" if not callable(lr) else "a schedule"
    loss = model.loss
    names = (
        ", ".join(f"{k}: {_name(v)}" for k, v in loss.items())
        if isinstance(loss, dict)
        else ", ".join(map(_name, loss))
        if isinstance(loss, (list, tuple))
        else _name(loss)
    )
    metrics = (
        [_name(m) for m in (model._compile_metrics._user_metrics or [])]
        if getattr(model, "_compile_metrics", None) is not None
        else []
    )
    if loss is None:  # compiled without a loss: the model's own add_loss trains it
        names = "none, the model's add_loss"
    where = "the model's compile" if compiled else "--loss"
    line = (
        f"loss: {names} ({where}), optimizer: {type(opt).__name__} {rate}, "
        f"metrics: {', '.join(map(str, _flat(metrics))) or 'none'}"
    )
    if compiled and (config.loss or config.metrics):
        line += "; the compile wins over --loss/--metrics"
    return line


def _name(thing) -> str:
    return (
        thing
        if isinstance(thing, str)
        else getattr(thing, "name", None) or getattr(thing, "__name__", type(thing).__name__)
    )


def _flat(values):
    from keras import tree

    return [_name(v) for v in tree.flatten(values)]


def user_callbacks(spec: str | None) -> list:
    """``--callbacks package.module:function``: the list it returns."""
    if not spec:
        return []
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (Exception, SystemExit) as e:
        raise ConfigError(
            f"--callbacks {spec}: cannot import it ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    try:
        callbacks = fn()
    except Exception as e:
        raise ConfigError(
            f"--callbacks {spec}: the function raised {type(e).__name__}: {str(e)[:200]}"
        ) from None
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(
            f"--callbacks {spec} returned {type(callbacks).__name__}; return a "
            "list of keras.callbacks.Callback"
        )
    return list(callbacks)


def splits(config: TrainConfig) -> dict[str, Any]:
    """``{"train": (x, y[, w]), "val": ..., "test": ...}`` as the data hold them."""
    data = config.data or "mnist"
    if data == "mnist":
        from mirrorfit.data.mnist import VALIDATION_SIZE, locate_mnist

        with np.load(locate_mnist(config.data_dir)) as f:
            x, y = f["x_train"], f["y_train"]
            return {
                "train": (x[VALIDATION_SIZE:], y[VALIDATION_SIZE:]),
                "val": (x[:VALIDATION_SIZE], y[:VALIDATION_SIZE]),
                "test": (f["x_test"], f["y_test"]),
            }
    if data.endswith(".npz"):
        return _npz_splits(data)
    if ":" in data:
        from mirrorfit.data.user import call_user_function

        return call_user_function(data, check=())
    raise ConfigError(
        f"--data {data} is not yet supported with a compiled --model; give "
        "mnist, FILE.npz or package.module:function"
    )


def _npz_splits(path: str) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError) as e:
        raise ConfigError(
            f"--data {path} is not a readable npz file ({type(e).__name__}: "
            f"{str(e)[:200]}); save it with numpy.savez"
        ) from None
    out = {}
    for split in ("train", "val", "test"):
        parts = [_member(arrays, f"{kind}_{split}") for kind in ("x", "y", "sample_weight")]
        if parts[0] is None:
            continue
        out[split] = tuple(p for p in parts if p is not None)
    if "train" not in out:
        raise ConfigError(f"--data {path} has no x_train (or x_train/NAME members)")
    return out


def _member(arrays: dict, key: str):
    if key in arrays:
        return arrays[key]
    named = {k[len(key) + 1 :]: v for k, v in arrays.items() if k.startswith(key + "/")}
    return named or None


def run(config: TrainConfig, console, model, *, compiled: bool, clock) -> dict[str, Any]:
    """Train ``model`` as compiled on ``config``'s data; print and return the summary."""
    import mirrorfit
    from mirrorfit.fitting.loop import fit, runner_of
    from mirrorfit.job.finish import state_fields

    data = splits(config)
    train, val, test = data["train"], data.get("val"), data.get("test")
    console.print(describe(config, model, compiled))
    clock.lap("data")
    if config.train_examples is not None:
        train = _first(train, config.train_examples)
    callbacks = [state_shown(console), *user_callbacks(config.callbacks)]
    if config.logdir:
        callbacks.append(epoch_scalars(config.logdir if _chief() else None))
    kwargs = {}
    if isinstance(train, tuple):
        kwargs.update(
            x=train[0],
            y=train[1] if len(train) > 1 else None,
            sample_weight=train[2] if len(train) > 2 else None,
        )
    else:
        kwargs["x"] = train
    if val is None and config.validation_split:
        kwargs["validation_split"] = config.validation_split
    _, global_batch = config.batch_sizes(_replicas(model))
    start = time.perf_counter()
    history = fit(
        model,
        batch_size=global_batch,
        epochs=config.epochs,
        verbose=1 if config.progress else 0,
        callbacks=callbacks,
        validation_data=val,
        steps_per_execution=config.steps_per_execution,
        accum_steps=config.accum_steps,
        checkpoint_dir=config.checkpoint_dir,
        checkpoint_every=config.checkpoint_every,
        keep_checkpoints=config.keep_checkpoints,
        fresh=config.fresh,
        allow_nan=config.allow_nan,
        **kwargs,
    )
    wall = time.perf_counter() - start
    clock.lap("fit")
    summary = {
        "model": config.model,
        "backend": config.backend,
        "global_batch_size": global_batch,
        "replicas": _replicas(model),
        "epochs": len(history.history.get("loss", [])),
        "wall_time_s": wall,
        "history": history.history,
        **state_fields(runner_of(model), config.shard),
    }
    if test is not None:
        tx = test if not isinstance(test, tuple) else test[0]
        rest = (
            {}
            if not isinstance(test, tuple)
            else {
                "y": test[1] if len(test) > 1 else None,
                "sample_weight": test[2] if len(test) > 2 else None,
            }
        )
        summary["test"] = mirrorfit.evaluate(
            model, tx, batch_size=global_batch, verbose=0, return_dict=True, **rest
        )
    last = {k: v[-1] for k, v in history.history.items()}
    console.print(
        "done: "
        + ", ".join(f"{k} {v:.4g}" for k, v in last.items())
        + (
            "; test " + ", ".join(f"{k} {v:.4g}" for k, v in summary["test"].items())
            if "test" in summary
            else ""
        )
    )
    chief = _chief()  # several workers: the chief writes
    if config.save_keras and chief:
        from mirrorfit.artifacts.finite import refuse_non_finite

        refuse_non_finite(model, "the trained model", allow=config.allow_nan)
        model.save(config.save_keras)
        console.print(f"saved {config.save_keras}")
    summary["timings_s"] = clock.timings
    if config.metrics_out and chief:
        from mirrorfit._io import write_json_atomic

        write_json_atomic(config.metrics_out, summary)
    return summary


def _first(split, n: int):
    """The first ``n`` examples of a training split (arrays, or a dict of them)."""
    from keras import tree

    if not isinstance(split, tuple):
        raise ConfigError(
            "--train-examples takes the first N of arrays; the --data function returns a "
            "dataset: return fewer examples from it instead"
        )
    return tuple(tree.map_structure(lambda a: a[:n], part) for part in split)


def epoch_scalars(logdir: str | None):
    """A callback writing each epoch's logs as TensorBoard scalars under ``logdir`` (``epoch/``
    then the key), with TensorBoard's own writer (no TensorFlow needed); None: write nothing
    (the workers but the chief)."""
    import keras

    from mirrorfit.job.observe import ScalarWriter

    writer = ScalarWriter(logdir)

    class EpochScalars(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            writer.epoch_callback(epoch, dict(logs or {}))

        def on_train_end(self, logs=None):
            writer.close()

    return EpochScalars()


def state_shown(console):
    """A callback printing what each device holds once the state is placed (the start
    screen's ``state:`` line, as mirrorfit's own loop prints it)."""
    import keras

    from mirrorfit.fitting.loop import runner_of
    from mirrorfit.job.finish import state_line

    class StateShown(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            console.print(state_line(runner_of(self.model)))

    return StateShown()


def _replicas(model) -> int:
    from mirrorfit.fitting.setup import current

    return current().replicas


def _chief() -> bool:
    from mirrorfit.fitting.setup import current

    return current().is_chief
