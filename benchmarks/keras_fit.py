"""mirrorfit.fit against mirrorfit train and against the model's own model.fit, on the chapter's
MLP (MNIST, batch 32, SGD 0.01, steps_per_execution 50), steady examples/s (every epoch but
the first, which compiles). Each side is its own process; the sides rotate each repeat and the
medians are compared:

* ``train``: ``mirrorfit train`` (the default job, on ``--backend``);
* ``fit``: ``mirrorfit.fit`` on the same model, batch and devices, given float32 pixels / 255;
* ``fit-u8``: the same given MNIST's uint8 pixels, a ``Rescaling(1/255)`` layer first: the
  bytes ``mirrorfit train`` moves (it scales in the step), a quarter of float32's;
* ``fit-nan``: ``fit`` with ``allow_nan=True``: without the divergence guard's read of the
  loss after every call of steps (what that guard costs);
* ``fit-2``: ``mirrorfit.fit`` on 2 logical CPU replicas;
* ``keras-2``: the model's own ``model.fit`` on the same 2 replicas (MirroredStrategy on
  TensorFlow, ``keras.distribution.DataParallel`` on JAX).

Usage::

    .venv/bin/python benchmarks/keras_fit.py --backend jax --repeats 3 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SIDE = textwrap.dedent("""
    import json, sys, time
    side, backend, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    replicas = 2 if side.endswith("-2") else 1
    import mirrorfit
    if side == "keras-2" and backend == "jax":
        import os
        os.environ["KERAS_BACKEND"] = "jax"
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
        import keras
        keras.distribution.set_distribution(keras.distribution.DataParallel())
    elif side == "keras-2":
        mirrorfit.setup(backend=backend, replicas=2)
    else:
        mirrorfit.setup(backend=backend, replicas=replicas)
    import keras, numpy as np
    data = mirrorfit.load_mnist()
    u8 = side == "fit-u8"
    x, y = (data.x_train if u8 else data.x_train.astype("float32") / 255.0), data.y_train
    keras.utils.set_random_seed(42)
    scale = [keras.layers.Rescaling(1 / 255)] if u8 else []
    model = keras.Sequential([keras.Input((28, 28)), *scale, keras.layers.Flatten(),
                              keras.layers.Dense(100, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=50)
    times = []
    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None): self.t = time.perf_counter()
        def on_epoch_end(self, epoch, logs=None): times.append(time.perf_counter() - self.t)
    kw = dict(batch_size=32, epochs=epochs, verbose=0, shuffle=True, callbacks=[Clock()])
    if side == "keras-2":
        model.fit(x, y, **kw)
    else:
        mirrorfit.fit(model, x, y, **kw, **({"allow_nan": True} if side == "fit-nan" else {}))
    steady = sum(times[1:])
    print(json.dumps({"examples_per_sec": len(x) * (len(times) - 1) / steady}))
""")


def run_side(side: str, backend: str, epochs: int) -> float:
    if side == "train":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "m.json"
            _run(
                [
                    sys.executable,
                    "-m",
                    "mirrorfit.cli",
                    "train",
                    "--backend",
                    backend,
                    "--epochs",
                    str(epochs),
                    "--metrics-out",
                    str(out),
                ],
                side,
            )
            return json.loads(out.read_text())["train_examples_per_sec"]
    proc = _run([sys.executable, "-c", SIDE, side, backend, str(epochs)], side)
    return json.loads(proc.stdout.strip().splitlines()[-1])["examples_per_sec"]


def _run(cmd: list[str], side: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(
            f"side {side} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
        )
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--sides", default="train,fit,fit-u8,fit-2,keras-2")
    args = parser.parse_args()
    sides = args.sides.split(",")
    rates: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(args.repeats):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        for side in order:
            rates[side].append(run_side(side, args.backend, args.epochs))
            print(f"repeat {r + 1} {side}: {rates[side][-1]:,.0f} examples/s", flush=True)
    med = {s: statistics.median(v) for s, v in rates.items()}
    print(f"\n{args.backend}, medians of {args.repeats} (steady examples/s):")
    for s in sides:
        print(f"  {s:8s} {med[s]:>10,.0f}")
    if "fit" in med and "train" in med:
        print(f"  fit / train     {med['fit'] / med['train']:.2f}x")
    if "fit-u8" in med and "train" in med:
        print(f"  fit-u8 / train  {med['fit-u8'] / med['train']:.2f}x")
    if "fit" in med and "fit-nan" in med:
        print(f"  fit / fit-nan   {med['fit'] / med['fit-nan']:.2f}x (the divergence guard)")
    if "fit-2" in med and "keras-2" in med:
        print(f"  fit-2 / keras-2 {med['fit-2'] / med['keras-2']:.2f}x")


if __name__ == "__main__":
    main()
