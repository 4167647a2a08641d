"""A bench point through ``mirrorfit.fit``, in its own process: a ``--model
package.module:function`` that returns a compiled model, trained as compiled on both sides, by
``mirrorfit.fit`` (``mirrorfit``) or by the model's own ``fit`` under the textbook's placement
(``textbook``: TensorFlow's MirroredStrategy, Keras's DataParallel on JAX); and mirrorfit's
side of a built-in model on MNIST or synthetic data, compiled as ``mirrorfit train`` compiles
it. Both read the same arrays as given (MNIST's uint8 pixels, or the synthetic batch repeated),
as ``mirrorfit train`` gives them. Throughput as :mod:`mirrorfit.bench.point` times it.
"""

from __future__ import annotations

import os
import time

from mirrorfit.errors import MirrorfitError


def run_fit_point(point) -> dict:
    """Run ``point`` (a :class:`mirrorfit.bench.point.Point` with ``compiled``) in this fresh
    process; its measurements, as :func:`mirrorfit.bench.point.run_point` returns them."""
    if point.data not in ("mnist", "synthetic"):
        raise MirrorfitError(
            f"--data {point.data}: a compiled --model is benched on MNIST or synthetic "
            "arrays; use --data mnist or --data synthetic"
        )
    if point.kind == "mirrorfit":
        import mirrorfit

        mirrorfit.setup(backend=point.backend, replicas=point.replicas, precision=point.precision)
        model, scope = _built(point), None
    else:
        scope = _textbook_scope(point)
        with scope():
            model = _built(point)
    import keras

    x, y, test = _arrays(point)
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


def _built(point):
    """The point's model, built in ``point``'s precision (its compile wraps the optimizer for
    fp16 as Keras does): the user's compiled one, or a built-in one compiled as ``mirrorfit
    train`` compiles it (the textbook's SGD 0.01, sparse categorical crossentropy, accuracy;
    MNIST's uint8 pixels scaled in the model)."""
    import keras

    from mirrorfit.models.build import model_factory, taking_pixels
    from mirrorfit.models.precision import Precision

    keras.utils.set_random_seed(point.seed)
    shape, classes = _shape(point)
    with Precision(point.precision).building():
        model = model_factory(point.model, input_shape=shape, num_classes=classes)()
        if point.compiled and not getattr(model, "compiled", False):
            raise MirrorfitError(f"--model {point.model} returned a model that is not compiled")
        if not point.compiled:
            if point.data == "mnist":
                model = taking_pixels(model)
            model.compile(
                optimizer=keras.optimizers.SGD(1e-2),
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
    return model


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
    if point.data == "synthetic":
        return tuple(point.input_shape), point.num_classes
    return (28, 28), 10


def _arrays(point):
    """(x, y, test (x, y) or None), as given to a compiled model: MNIST's arrays, or the
    synthetic batch repeated (the JAX rows' data)."""
    import numpy as np

    from mirrorfit.bench.jax_point import _arrays as arrays

    x, y, test, steps = arrays(point)
    if point.data == "synthetic":
        xb, yb = x.host_batch()
        return np.concatenate([xb] * steps), np.concatenate([yb] * steps), None
    return x, y, test


def _accuracy(logs: dict) -> float | None:
    """The evaluation's accuracy, under whatever name the compile gave it; None without one."""
    names = [k for k in logs if "acc" in k.lower()]
    return float(logs[names[0]]) if names else None


__all__ = ["run_fit_point"]
