"""One bench point in its own process: a training run, the textbook recipe, or the peak.
``python -m mirrorfit.bench.point '{"kind": "mirrorfit", ...}'`` prints one JSON line.
Throughput, both sides alike: wall time from the end of epoch 1 to the end of the last epoch,
everything in between included. Both sides read the same data: MNIST arrays, or the same
tf.data pipeline for any other source. (why: docs/architecture.md#the-bench)
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass

from mirrorfit.models.precision import COMPUTE_DTYPES


@dataclass(frozen=True)
class Point:
    """One configuration. ``global_batch`` is the effective batch per optimizer step (with
    accumulation each replica runs ``accum_steps`` micro-batches of global/(replicas x accum))."""

    kind: str  # "mirrorfit", "textbook" (Keras's own fit) or "peak"
    model: str = "mlp"
    backend: str = "tensorflow"  # or "jax" (mirrorfit.bench.jax_point runs it)
    replicas: int = 1
    precision: str = "fp32"
    xla: bool = False
    accum_steps: int = 1
    steps_per_execution: int = 50
    global_batch: int = 64
    train_examples: int | None = None
    epochs: int = 2
    seed: int = 1
    data_dir: str | None = None
    data: str = "mnist"  # "synthetic": random batches, no input pipeline cost; or any --data
    input_shape: tuple[int, ...] | None = None  # synthetic: one example's shape; else a check
    num_classes: int | None = None  # synthetic: labels; else --num-classes
    # Other sources: `mirrorfit train`'s flags of the same names, passed to load_data.
    image_size: tuple[int, int] | None = None  # (height, width) pixels
    image_feature: str = "image/encoded"
    label_feature: str = "image/class/label"
    cache: str | None = None
    validation_split: float | None = None
    dtypes: tuple[str, ...] = tuple(COMPUTE_DTYPES.values())  # peak: the dtypes to measure
    compiled: bool = False  # the --model function compiles its model: trained as compiled

    def __post_init__(self) -> None:
        # from JSON as lists; a Point is a dict key
        for name in ("input_shape", "image_size", "dtypes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def label(self) -> str:
        jax = "jax " if self.backend == "jax" else ""
        if self.kind == "textbook":
            suffix = "" if self.precision == "fp32" else f" {self.precision}"
            name = "keras fit" if jax else "textbook fit"  # JAX: fit under DataParallel
            return f"{jax}{name} x{self.replicas}{suffix}"
        parts = [f"{jax}x{self.replicas}", self.precision]
        if self.xla:
            parts.append("xla")
        if self.accum_steps > 1:
            parts.append(f"accum{self.accum_steps}")
        parts.append(f"spe{self.steps_per_execution}")
        return " ".join(parts)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def run_point(point: Point) -> dict:
    """Run ``point`` in this (fresh) process; return its measurements (examples/s; test
    accuracy, None on synthetic data, which has nothing to learn, and on a source without a
    test split)."""
    if (point.compiled and point.kind != "peak") or point.kind == "mirrorfit":  # train's loop
        from mirrorfit.bench.fit_point import run_fit_point

        return run_fit_point(point)
    if point.backend == "jax":  # before Keras loads: its backend is chosen once
        from mirrorfit.bench.jax_point import run_jax_point

        return run_jax_point(point)
    if point.kind == "peak":
        from mirrorfit.bench.flops import matmul_peak_flops

        return {dtype: matmul_peak_flops(dtype) for dtype in point.dtypes}
    import keras

    import mirrorfit

    # Both sides (the textbook recipe and mirrorfit) train with the same host allocator.
    setup = mirrorfit.configure_devices(replicas=point.replicas, keep_freed_memory=True)
    strategy = mirrorfit.build_strategy(setup)
    keras.utils.set_random_seed(point.seed)
    train, test, steps = _data(point)
    with _explained(train.source):
        return _measure(point, strategy, train, test, steps)


def _measure(point: Point, strategy, train: "_Train", test, steps: int) -> dict:
    """Build, train and test ``point``'s model under ``strategy``; its measurements."""
    import mirrorfit

    factory = mirrorfit.models.model_factory(
        point.model, input_shape=train.input_shape, num_classes=train.num_classes
    )
    ends: list[float] = []
    stamp = lambda *_: ends.append(time.perf_counter())  # noqa: E731 (both sides' epoch ends)
    net = _textbook_model(point, strategy, factory)  # mirrorfit's side: bench/fit_point.py
    _textbook_fit(net, point, train, steps, stamp)
    accuracy = _textbook_accuracy(net, point, train, test)
    examples = steps * point.global_batch * (point.epochs - 1)
    return {
        "examples_per_sec": examples / (ends[-1] - ends[0]),
        "test_accuracy": None if accuracy is None else float(accuracy),
        "xla_used": False,
    }


def _textbook_model(point: Point, strategy, factory):
    """The textbook recipe's model, built and compiled under ``strategy``: Keras's own mixed
    precision, as users do it."""
    import keras

    from mirrorfit.models.precision import Precision

    precision = Precision(point.precision)
    with strategy.scope():
        with precision.building():
            net = factory()
        net.compile(
            loss="sparse_categorical_crossentropy",
            optimizer=precision.wrap_optimizer(keras.optimizers.SGD(1e-2)),
            metrics=["accuracy"],
        )
    return net


def _textbook_fit(net, point: Point, train: "_Train", steps: int, stamp) -> None:
    """Keras's ``fit`` on ``train``, calling ``stamp`` at each epoch's end."""
    import keras

    callback = keras.callbacks.LambdaCallback(on_epoch_end=stamp)
    if train.batches is not None:  # the same tf.data pipeline mirrorfit reads
        net.fit(
            train.batches.dataset(epochs=point.epochs),
            steps_per_epoch=steps,
            epochs=point.epochs,
            verbose=0,
            callbacks=[callback],
        )
    else:
        net.fit(
            train.x / 255.0,
            train.y,
            batch_size=point.global_batch,
            epochs=point.epochs,
            verbose=0,
            callbacks=[callback],
        )


def _textbook_accuracy(net, point: Point, train: "_Train", test):
    """Keras's ``evaluate`` of ``net`` on ``test``: its accuracy, None without test data."""
    if test is None:
        return None
    if train.x is not None:  # MNIST, as the chapter evaluates it
        return net.evaluate(test[0] / 255.0, test[1], batch_size=point.global_batch, verbose=0)[1]
    # the batches mirrorfit's evaluate reads (arrays: scaled as mirrorfit scales them)
    return net.evaluate(_eval_batches(test, point.global_batch), verbose=0)[1]


@dataclass
class _Train:
    """A point's training data: MNIST arrays (``x``, ``y``), or ``batches`` (synthetic, or the
    ``train`` of the :class:`~mirrorfit.data.sources.Data` ``source``)."""

    input_shape: tuple[int, ...]
    num_classes: int
    x: object = None
    y: object = None
    batches: object = None
    source: object = None


def _data(point: Point) -> tuple[_Train, object, int]:
    """(training data, test data or None, optimizer steps per epoch) for ``point``. Test data
    is (x, y) arrays, or a tf.data.Dataset of global batches."""
    if point.data not in ("mnist", "synthetic"):
        from mirrorfit.bench.fit_point import load_source

        data = load_source(point)
        train = _Train(tuple(data.input_shape), data.num_classes, batches=data.train, source=data)
        return train, data.test, data.train.steps_per_epoch
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
        return _Train(point.input_shape, point.num_classes, batches=batches), None, steps
    import mirrorfit

    data = mirrorfit.load_mnist(point.data_dir, train_examples=point.train_examples, download=False)
    train = _Train(tuple(data.x_train.shape[1:]), 10, x=data.x_train, y=data.y_train)
    return train, (data.x_test, data.y_test), len(data.x_train) // point.global_batch


def _eval_batches(test, global_batch: int):
    """``test`` as the dataset of global batches ``Trainer.evaluate`` reads: a dataset as it
    is, arrays through the same pipeline (uint8 pixels scaled to [0, 1], others cast)."""
    if not isinstance(test, tuple):
        return test
    from mirrorfit.data.pipeline import eval_dataset

    return eval_dataset(test[0], test[1], global_batch=global_batch)


def _explained(source):
    """A tf.data error about ``source``'s files (an image that does not decode) as the
    one-line DataError `mirrorfit train` gives, for the report's error column."""
    if source is None:
        return contextlib.nullcontext()
    from mirrorfit.data.file_errors import data_errors

    return data_errors(source)


def main() -> None:
    from mirrorfit.errors import MirrorfitError

    point = Point(**json.loads(sys.argv[1]))
    try:
        result = run_point(point)
    except MirrorfitError as e:  # one line, the last on stderr: what the report shows
        print(f"mirrorfit: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
