"""One bench point, run in its own process: a training run, the textbook recipe, or the peak.

Logical devices are fixed when TensorFlow starts, so every point is a fresh interpreter:
``python -m mirrorfit.bench.point '{"kind": "mirrorfit", ...}'`` prints one JSON line.
Throughput is measured the same way for both sides: wall time between the end of epoch 1 and
the end of the last epoch (epoch 1 traces and compiles), everything in between included.
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
    """Run ``point`` in this (fresh) process; return its measurements."""
    if point.kind == "peak":
        from mirrorfit.bench.flops import matmul_peak_flops
        return {dtype: matmul_peak_flops(dtype) for dtype in ("float32", "bfloat16", "float16")}
    import keras

    import mirrorfit

    setup = mirrorfit.configure_devices(replicas=point.replicas)
    strategy = mirrorfit.build_strategy(setup)
    data = mirrorfit.load_mnist(point.data_dir, train_examples=point.train_examples,
                                download=False)
    keras.utils.set_random_seed(point.seed)
    factory = mirrorfit.models.model_factory(point.model)
    ends: list[float] = []
    if point.kind == "textbook":
        from mirrorfit.precision import Precision
        precision = Precision(point.precision)  # Keras's own mixed precision, as users do it
        with strategy.scope():
            with precision.building():
                net = factory()
            net.compile(loss="sparse_categorical_crossentropy",
                        optimizer=precision.wrap_optimizer(keras.optimizers.SGD(1e-2)),
                        metrics=["accuracy"])
        stamp = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda e, logs: ends.append(time.perf_counter()))
        net.fit(data.x_train / 255.0, data.y_train, batch_size=point.global_batch,
                epochs=point.epochs, verbose=0, callbacks=[stamp])
        _, accuracy = net.evaluate(data.x_test / 255.0, data.y_test,
                                   batch_size=point.global_batch, verbose=0)
        xla_used = False
    else:
        trainer = mirrorfit.Trainer(
            strategy=strategy, model=factory, optimizer=keras.optimizers.SGD(learning_rate=1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=point.global_batch,
            steps_per_execution=point.steps_per_execution, accum_steps=point.accum_steps,
            precision=point.precision, jit_compile=point.xla,
            on_notice=lambda msg: print(msg, file=sys.stderr))
        trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train,
                                            global_batch=point.global_batch, seed=point.seed),
                    epochs=point.epochs, callbacks=[lambda e, logs: ends.append(time.perf_counter())])
        accuracy = trainer.evaluate((data.x_test, data.y_test))["accuracy"]
        xla_used = trainer.jit_compile
    steps = len(data.x_train) // point.global_batch
    examples = steps * point.global_batch * (point.epochs - 1)
    return {"examples_per_sec": examples / (ends[-1] - ends[0]), "test_accuracy": float(accuracy),
            "xla_used": xla_used}


def main() -> None:
    point = Point(**json.loads(sys.argv[1]))
    print(json.dumps(run_point(point)))


if __name__ == "__main__":
    main()
