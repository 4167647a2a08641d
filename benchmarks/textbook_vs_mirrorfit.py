"""The textbook recipe (Keras fit under MirroredStrategy) vs mirrorfit, side by side.

Each run is its own process (logical devices are fixed at TensorFlow start-up). Sides alternate
and repeat, because this machine is shared and noisy; we report medians, the spread, and ratios
of medians. Throughput is wall time over epochs 2..E (epoch 1 traces and compiles), measured the
same way on both sides: from an epoch-end callback, everything in between included.

    python benchmarks/textbook_vs_mirrorfit.py --data-dir ../shared/data [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

WORKLOADS = {  # model: (global batch, training images, epochs)
    "mlp": (64, None, 3),
    "cnn": (100, 12800, 2),
}


def run_side(side: str, model: str, replicas: int, data_dir: str) -> dict:
    """Train once in this process and return examples/s (epochs 2..E) and test accuracy."""
    import keras
    import mirrorfit

    global_batch, n_train, epochs = WORKLOADS[model]
    setup = mirrorfit.configure_devices(replicas=replicas)
    strategy = mirrorfit.build_strategy(setup)
    data = mirrorfit.load_mnist(data_dir, train_examples=n_train, download=False)
    keras.utils.set_random_seed(1)
    ends: list[float] = []
    factory = mirrorfit.models.model_factory(model)
    if side == "textbook":
        with strategy.scope():
            net = factory()
            net.compile(loss="sparse_categorical_crossentropy",
                        optimizer=keras.optimizers.SGD(learning_rate=1e-2), metrics=["accuracy"])
        stamp = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda e, logs: ends.append(time.perf_counter()))
        net.fit(data.x_train / 255.0, data.y_train, batch_size=global_batch, epochs=epochs,
                verbose=0, callbacks=[stamp])
        _, accuracy = net.evaluate(data.x_test / 255.0, data.y_test, batch_size=global_batch,
                                   verbose=0)
    else:
        trainer = mirrorfit.Trainer(
            strategy=strategy, model=factory, optimizer=keras.optimizers.SGD(learning_rate=1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=global_batch,
            steps_per_execution=50)
        trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train,
                                            global_batch=global_batch, seed=1),
                    epochs=epochs, callbacks=[lambda e, logs: ends.append(time.perf_counter())])
        accuracy = trainer.evaluate((data.x_test, data.y_test))["accuracy"]
    steps = len(data.x_train) // global_batch
    examples = steps * global_batch * (epochs - 1)
    return {"examples_per_sec": examples / (ends[-1] - ends[0]), "test_accuracy": accuracy}


def _spawn(side: str, replicas: int, model: str, data_dir: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, __file__, "--side", side, "--model", model,
                          "--replicas", str(replicas), "--data-dir", data_dir],
                         capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        sys.exit(f"{side} {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict]) -> tuple[float, float, float, float]:
    xs = [r["examples_per_sec"] for r in runs]
    return (statistics.median(xs), min(xs), max(xs),
            statistics.median(r["test_accuracy"] for r in runs))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MIRRORFIT_DATA", "../shared/data"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--side", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--replicas", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:  # a child process: one run
        print(json.dumps(run_side(a.side, a.model, a.replicas, a.data_dir)))
        return
    sides = [("textbook", 2), ("mirrorfit", 2), ("mirrorfit", 1)]
    for model in a.models.split(","):
        runs: dict[tuple[str, int], list[dict]] = {s: [] for s in sides}
        for rep in range(a.repeats):
            for side in sides if rep % 2 == 0 else sides[::-1]:  # alternate the order
                runs[side].append(_spawn(*side, model, a.data_dir))
                r = runs[side][-1]
                print(f"  {model} {side[0]:9} x{side[1]}  run {rep + 1}: "
                      f"{r['examples_per_sec']:9,.0f} examples/s  acc {r['test_accuracy']:.4f}",
                      flush=True)
        gb, n, epochs = WORKLOADS[model]
        print(f"\n{model.upper()}: global batch {gb}, {n or 55000} training images, "
              f"{epochs} epochs, {a.repeats} runs per side (median [min-max])")
        med = {}
        for side in sides:
            m, lo, hi, acc = _summary(runs[side])
            med[side] = m
            print(f"  {side[0]:9} {side[1]} replica(s): {m:9,.0f} examples/s "
                  f"[{lo:,.0f}-{hi:,.0f}]  test accuracy {acc:.4f}")
        print(f"  ratio mirrorfit / textbook (2 replicas): "
              f"{med[('mirrorfit', 2)] / med[('textbook', 2)]:.2f}x")
        print(f"  ratio mirrorfit 2 replicas / 1 replica:   "
              f"{med[('mirrorfit', 2)] / med[('mirrorfit', 1)]:.2f}x\n", flush=True)


if __name__ == "__main__":
    main()
