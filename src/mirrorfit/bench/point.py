"""One bench point, run in its own process: a training run, the textbook recipe, or the peak.

Logical devices are fixed when TensorFlow starts, so every point is a fresh interpreter:
``python -m mirrorfit.bench.point '{"kind": "mirrorfit", ...}'`` prints one JSON line.
Throughput is measured the same way for both sides: wall time between the end of epoch 1 and
the end of the last epoch (epoch 1 traces and compiles), everything in between included. Both
sides read the same data: MNIST arrays, or (``data="synthetic"``) the same repeated random
batch, given to Keras ``fit`` as the same tf.data pipeline mirrorfit reads.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Point:
    """One configuration. ``global_batch`` is the effective batch per optimizer step (with
    accumulation each replica runs ``accum_steps`` micro-batches of global/(replicas x accum))."""

    kind: str  # "mirrorfit", "textbook" or "peak"
    model: str = "mlp"
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
    data: str = "mnist"  # or "synthetic": random batches, no input pipeline cost
    input_shape: tuple[int, ...] | None = None  # synthetic: one example's shape
    num_classes: int | None = None  # synthetic: labels

    def __post_init__(self) -> None:
        if self.input_shape is not None:  # from JSON as a list; a Point is a dict key
            object.__setattr__(self, "input_shape", tuple(self.input_shape))

    @property
    def label(self) -> str:
        if self.kind == "textbook":
            suffix = "" if self.precision == "fp32" else f" {self.precision}"
            return f"textbook fit x{self.replicas}{suffix}"
        parts = [f"x{self.replicas}", self.precision]
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
    accuracy, None on synthetic data, which has nothing to learn)."""
    if point.kind == "peak":
        from mirrorfit.bench.flops import matmul_peak_flops
        return {dtype: matmul_peak_flops(dtype) for dtype in ("float32", "bfloat16", "float16")}
    import keras

    import mirrorfit

    setup = mirrorfit.configure_devices(replicas=point.replicas)
    strategy = mirrorfit.build_strategy(setup)
    keras.utils.set_random_seed(point.seed)
    train, test, steps = _data(point)
    factory = mirrorfit.models.model_factory(point.model, input_shape=train.input_shape,
                                             num_classes=train.num_classes)
    ends: list[float] = []
    stamp = lambda *_: ends.append(time.perf_counter())  # noqa: E731 (both sides' epoch ends)
    if point.kind == "textbook":
        from mirrorfit.precision import Precision
        precision = Precision(point.precision)  # Keras's own mixed precision, as users do it
        with strategy.scope():
            with precision.building():
                net = factory()
            net.compile(loss="sparse_categorical_crossentropy",
                        optimizer=precision.wrap_optimizer(keras.optimizers.SGD(1e-2)),
                        metrics=["accuracy"])
        callback = keras.callbacks.LambdaCallback(on_epoch_end=stamp)
        if train.batches is not None:  # the same tf.data pipeline mirrorfit reads
            net.fit(train.batches.dataset(epochs=point.epochs), steps_per_epoch=steps,
                    epochs=point.epochs, verbose=0, callbacks=[callback])
        else:
            net.fit(train.x / 255.0, train.y, batch_size=point.global_batch,
                    epochs=point.epochs, verbose=0, callbacks=[callback])
        accuracy = None if test is None else net.evaluate(
            test[0] / 255.0, test[1], batch_size=point.global_batch, verbose=0)[1]
        xla_used = False
    else:
        trainer = mirrorfit.Trainer(
            strategy=strategy, model=factory, optimizer=keras.optimizers.SGD(learning_rate=1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=point.global_batch,
            steps_per_execution=point.steps_per_execution, accum_steps=point.accum_steps,
            precision=point.precision, jit_compile=point.xla,
            on_notice=lambda msg: print(msg, file=sys.stderr))
        batches = train.batches or mirrorfit.train_batches(
            train.x, train.y, global_batch=point.global_batch, seed=point.seed)
        trainer.fit(batches, epochs=point.epochs, callbacks=[stamp])
        accuracy = None if test is None else trainer.evaluate(test)["accuracy"]
        xla_used = trainer.jit_compile
    examples = steps * point.global_batch * (point.epochs - 1)
    return {"examples_per_sec": examples / (ends[-1] - ends[0]),
            "test_accuracy": None if accuracy is None else float(accuracy),
            "xla_used": xla_used}


@dataclass
class _Train:
    """A point's training data: MNIST arrays (``x``, ``y``), or synthetic ``batches``."""

    input_shape: tuple[int, ...]
    num_classes: int
    x: object = None
    y: object = None
    batches: object = None


def _data(point: Point) -> tuple[_Train, tuple | None, int]:
    """(training data, test arrays or None, optimizer steps per epoch) for ``point``."""
    if point.data == "synthetic":
        from mirrorfit.data.synthetic import synthetic_batches

        steps = max(1, (point.train_examples or point.global_batch) // point.global_batch)
        batches = synthetic_batches(input_shape=point.input_shape, num_classes=point.num_classes,
                                    global_batch=point.global_batch, steps_per_epoch=steps,
                                    seed=point.seed)
        return _Train(point.input_shape, point.num_classes, batches=batches), None, steps
    import mirrorfit

    data = mirrorfit.load_mnist(point.data_dir, train_examples=point.train_examples,
                                download=False)
    train = _Train(tuple(data.x_train.shape[1:]), 10, x=data.x_train, y=data.y_train)
    return train, (data.x_test, data.y_test), len(data.x_train) // point.global_batch


def main() -> None:
    point = Point(**json.loads(sys.argv[1]))
    print(json.dumps(run_point(point)))


if __name__ == "__main__":
    main()
