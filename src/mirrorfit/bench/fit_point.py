"""A bench point through ``mirrorfit.fit``, in its own process: a ``--model
package.module:function`` that returns a compiled model, trained as compiled on both sides, by
``mirrorfit.fit`` (``mirrorfit``) or by the model's own ``fit`` under the textbook's placement
(``textbook``: TensorFlow's MirroredStrategy, Keras's DataParallel on JAX); and mirrorfit's
side of a built-in model on any ``--data``, compiled as ``mirrorfit train`` compiles it. Both
read the same arrays as given (MNIST's uint8 pixels, the synthetic batch repeated, or what
``mirrorfit train`` reads of any other source: job/keras_job.splits), as ``mirrorfit train``
gives them. Throughput as :mod:`mirrorfit.bench.point` times it.
"""

from __future__ import annotations

import contextlib
import os
import time

from mirrorfit.errors import MirrorfitError


def run_fit_point(point) -> dict:
    """Run ``point`` (a :class:`mirrorfit.bench.point.Point` with ``compiled``) in this fresh
    process; its measurements, as :func:`mirrorfit.bench.point.run_point` returns them."""
    if point.compiled and point.data not in ("mnist", "synthetic"):
        raise MirrorfitError(
            f"--data {point.data}: a compiled --model is benched on MNIST or synthetic "
            "arrays; use --data mnist or --data synthetic"
        )
    if point.kind == "mirrorfit":
        import mirrorfit

        mirrorfit.setup(backend=point.backend, replicas=point.replicas, precision=point.precision)
        scope = None
        model, (x, y, test) = _built(point, contextlib.nullcontext)
    else:
        scope = _textbook_scope(point)
        model, (x, y, test) = _built(point, scope)
    import keras

    ends: list[float] = []
    stamp = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ends.append(time.perf_counter()))
    common = dict(batch_size=point.global_batch, epochs=point.epochs, verbose=0, callbacks=[stamp])
    if point.kind == "mirrorfit":
        import mirrorfit

        if point.xla:  # TensorFlow's XLA; JAX compiles every step anyway
            model.jit_compile = True
        mirrorfit.fit(
            model,
            x,
            y,
            steps_per_execution=point.steps_per_execution,
            accum_steps=point.accum_steps,
            **common,
        )
        evaluate = mirrorfit.evaluate
        xla = bool(getattr(mirrorfit.fitting.loop.runner_of(model), "jit_compile", True))
    else:
        if point.backend == "jax":  # the point's, as bench's other JAX yardstick runs
            model.steps_per_execution = point.steps_per_execution
        with scope():
            model.fit(x, y, **common)

        def evaluate(m, *args, **kwargs):
            with scope():
                return m.evaluate(*args, **kwargs)

        xla = bool(model.jit_compile)  # Keras's "auto": on under JAX, and on TF with a GPU
    accuracy = None
    if test is not None:
        logs = evaluate(model, *test, batch_size=point.global_batch, verbose=0, return_dict=True)
        accuracy = _accuracy(logs)
    examples = len(x) * (point.epochs - 1)  # epoch 1 (compiling) not counted
    return {
        "examples_per_sec": examples / (ends[-1] - ends[0]),
        "test_accuracy": accuracy,
        "xla_used": xla,
    }


def _built(point, scope):
    """(the point's model, built in ``scope()`` and ``point``'s precision (its compile wraps
    the optimizer for fp16 as Keras does), its data as :func:`_arrays` gives it): the user's
    compiled model, or a built-in one compiled as ``mirrorfit train`` compiles it (the
    textbook's SGD 0.01, sparse categorical crossentropy, accuracy; uint8 pixels scaled in the
    model)."""
    import keras

    from mirrorfit.models.build import model_factory, taking_pixels
    from mirrorfit.models.precision import Precision

    keras.utils.set_random_seed(point.seed)
    shape, classes = _shape(point)
    with scope(), Precision(point.precision).building():
        model = model_factory(point.model, input_shape=shape, num_classes=classes)()
        if point.compiled and not getattr(model, "compiled", False):
            raise MirrorfitError(f"--model {point.model} returned a model that is not compiled")
        data = _arrays(point, model)
        if not point.compiled:
            if getattr(data[0], "dtype", None) == "uint8":
                model = taking_pixels(model, tuple(data[0].shape[1:]))
            model.compile(
                optimizer=keras.optimizers.SGD(1e-2),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
    return model, data


def _textbook_scope(point):
    """Where Keras's own fit runs, as a function giving a fresh context to build, train and
    evaluate in: TensorFlow's MirroredStrategy scope, or on JAX Keras's DataParallel (set for
    the process: no context needed)."""
    import contextlib

    if point.backend == "jax":
        os.environ["KERAS_BACKEND"] = "jax"
        from mirrorfit.engine import jax as engine

        setup = engine.configure_devices(replicas=point.replicas, keep_freed_memory=True)
        import keras

        if point.replicas > 1:
            keras.distribution.set_distribution(
                keras.distribution.DataParallel(devices=list(setup.handles))
            )
        return contextlib.nullcontext
    import mirrorfit

    setup = mirrorfit.configure_devices(replicas=point.replicas, keep_freed_memory=True)
    return mirrorfit.build_strategy(setup).scope


def _shape(point) -> tuple[tuple[int, ...], int]:
    """(one example's shape, classes) the model is built for."""
    if point.data == "synthetic":
        return tuple(point.input_shape), point.num_classes
    if point.data == "mnist":
        return (28, 28), 10
    data = load_source(point)  # opened for its shape, as `mirrorfit train` opens it
    return tuple(data.input_shape), data.num_classes


def load_source(point):
    """A file or function source (``--data``) opened as ``point`` reads it: a
    :class:`mirrorfit.data.sources.Data`."""
    from mirrorfit.data.sources import load_data
    from mirrorfit.job.data import source

    return load_data(point.data, global_batch=point.global_batch, **source(_config(point)))


def _arrays(point, model):
    """(x, y, test (x, y) or None), as given to the model: MNIST's arrays, the synthetic
    batch repeated (the JAX rows' data), or any other source's as `mirrorfit train` reads
    them for ``model`` (image folders and TFRecords: uint8 pixels, decoded once)."""
    import numpy as np

    if point.data not in ("mnist", "synthetic"):
        from mirrorfit.job.keras_job import splits

        found = splits(_config(point), model, point.global_batch)
        train, test = found["train"], found.get("test")
        if not isinstance(train, tuple) or not isinstance(test, (type(None), tuple)):
            raise MirrorfitError(
                f"--data {point.data} returns a dataset; bench reads arrays (x, y): return "
                "NumPy arrays, or bench with --data mnist or synthetic"
            )
        return train[0], train[1], None if test is None else test[:2]
    from mirrorfit.bench.jax_point import _arrays as arrays

    x, y, test, steps = arrays(point)
    if point.data == "synthetic":
        xb, yb = x.host_batch()
        return np.concatenate([xb] * steps), np.concatenate([yb] * steps), None
    return x, y, test


def _config(point):
    """``point``'s data flags as `mirrorfit train` takes them."""
    from mirrorfit.config import TrainConfig

    return TrainConfig(
        model=point.model,
        data=point.data,
        data_dir=point.data_dir,
        seed=point.seed,
        global_batch_size=point.global_batch,
        train_examples=point.train_examples,
        validation_split=point.validation_split,
        image_size=point.image_size,
        image_feature=point.image_feature,
        label_feature=point.label_feature,
        cache=point.cache,
        input_shape=point.input_shape,
        num_classes=point.num_classes,
    )


def _accuracy(logs: dict) -> float | None:
    """The evaluation's accuracy, under whatever name the compile gave it; None without one."""
    names = [k for k in logs if "acc" in k.lower()]
    return float(logs[names[0]]) if names else None


__all__ = ["load_source", "run_fit_point"]
