"""A bench point on JAX, in its own process (``mirrorfit.bench.point`` hands it a point whose
``backend`` is ``jax``, before Keras loads): Keras's own ``fit`` on JAX (the yardstick:
``keras.distribution.DataParallel`` over the same devices, the point's
``steps_per_execution``), or XLA's matmul peak; mirrorfit's side runs through
``mirrorfit.fit`` (:mod:`mirrorfit.bench.fit_point`). Throughput as :mod:`mirrorfit.bench.point`
times it. No TensorFlow: on MNIST and synthetic data this runs where only JAX is installed.
"""

from __future__ import annotations

import os
import time


def run_jax_point(point) -> dict:
    """Run ``point`` (a :class:`mirrorfit.bench.point.Point` with ``backend == "jax"``) in this
    fresh process; its measurements, as :func:`mirrorfit.bench.point.run_point` returns them."""
    os.environ["KERAS_BACKEND"] = "jax"
    from mirrorfit.engine import jax as engine

    setup = engine.configure_devices(replicas=point.replicas, keep_freed_memory=True)
    if point.kind == "peak":
        return {dtype: matmul_peak_flops(dtype) for dtype in point.dtypes}
    engine.seed(point.seed)
    x, y, test, steps = _arrays(point)  # mirrorfit's side ran through mirrorfit.fit (fit_point)
    return _keras_fit(point, setup, x, y, test, steps)


def _arrays(point):
    """(x, y, test arrays or None, steps per epoch): MNIST or the synthetic batch repeated."""
    if point.data == "synthetic":
        from mirrorfit.data.synthetic import synthetic_batches

        steps = max(1, (point.train_examples or point.global_batch) // point.global_batch)
        batches = synthetic_batches(
            input_shape=point.input_shape,
            num_classes=point.num_classes,
            global_batch=point.global_batch,
            steps_per_epoch=steps,
            seed=point.seed,
        )
        return batches, None, None, steps
    if point.data != "mnist":
        from mirrorfit.errors import ConfigError

        raise ConfigError(
            f"--data {point.data}: bench's JAX rows read MNIST or synthetic data; "
            "use --backend tensorflow for other sources"
        )
    import mirrorfit

    data = mirrorfit.load_mnist(point.data_dir, train_examples=point.train_examples, download=False)
    return (
        data.x_train,
        data.y_train,
        (data.x_test, data.y_test),
        len(data.x_train) // point.global_batch,
    )


def _factory(point, shape, classes):
    import mirrorfit

    return mirrorfit.models.model_factory(point.model, input_shape=shape, num_classes=classes)


def _keras_fit(point, setup, x, y, test, steps) -> dict:
    """Keras's own fit on JAX, data parallel over the same devices (the yardstick)."""
    import keras
    import numpy as np

    from mirrorfit.models.precision import Precision

    if point.replicas > 1:
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=list(setup.handles))
        )
    synthetic = test is None and not hasattr(x, "shape")
    if synthetic:
        xb, yb = x.host_batch()
        x = np.concatenate([xb] * steps)
        y = np.concatenate([yb] * steps)
        shape, classes = point.input_shape, point.num_classes
    else:
        x, shape, classes = x / 255.0, tuple(x.shape[1:]), 10
    precision = Precision(point.precision)
    with precision.building():
        net = _factory(point, shape, classes)()
    net.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=precision.wrap_optimizer(keras.optimizers.SGD(1e-2)),
        metrics=["accuracy"],
        steps_per_execution=point.steps_per_execution,
    )
    ends: list[float] = []
    net.fit(
        x,
        y,
        batch_size=point.global_batch,
        epochs=point.epochs,
        verbose=0,
        shuffle=True,
        callbacks=[
            keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: ends.append(time.perf_counter()))
        ],
    )
    accuracy = (
        None
        if test is None
        else net.evaluate(test[0] / 255.0, test[1], batch_size=point.global_batch, verbose=0)[1]
    )
    return _result(point, steps, ends, accuracy, xla_used=True)


def _result(point, steps, ends, accuracy, *, xla_used: bool) -> dict:
    examples = steps * point.global_batch * (point.epochs - 1)
    return {
        "examples_per_sec": examples / (ends[-1] - ends[0]),
        "test_accuracy": None if accuracy is None else float(accuracy),
        "xla_used": xla_used,
    }


def matmul_peak_flops(dtype: str = "float32", n: int = 2048, seconds: float = 1.0) -> float:
    """Best measured FLOP/s of an ``n`` x ``n`` matmul in ``dtype`` on JAX's first device,
    over repeated timed runs of about ``seconds`` in all (as
    :func:`mirrorfit.bench.flops.matmul_peak_flops` measures TensorFlow's)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.uniform(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = a.T

    @jax.jit
    def chain(x, y):
        def body(i, acc):
            return acc + jnp.sum((x @ (y + i.astype(y.dtype)))[:1, :1]).astype(jnp.float32)

        return jax.lax.fori_loop(0, 3, body, jnp.zeros((), jnp.float32))

    chain(a, b).block_until_ready()  # compile, warm up
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        chain(a, b).block_until_ready()
        best = max(best, 3 * 2 * n**3 / (time.perf_counter() - t0))
    return best


def train_flops_per_example(model) -> int:
    """Training FLOPs per example by XLA's cost analysis of one example's forward pass, x 3
    (what :func:`mirrorfit.bench.flops.train_flops_per_example` counts with TensorFlow's op
    statistics, where TensorFlow is not installed)."""
    import jax
    import jax.numpy as jnp

    from mirrorfit.bench.flops import TRAIN_FLOPS_PER_FORWARD

    spec = jnp.zeros((1, *model.inputs[0].shape[1:]), jnp.float32)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def forward(x):
        return model.stateless_call(trainable, non_trainable, x, training=False)[0]

    cost = jax.jit(forward).lower(spec).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return TRAIN_FLOPS_PER_FORWARD * int(cost.get("flops", 0))


__all__ = ["run_jax_point", "matmul_peak_flops", "train_flops_per_example"]
