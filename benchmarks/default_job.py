"""The default job (the chapter's MLP on MNIST: batch 32, 10 epochs, SGD 0.01, validation on
the first 5,000 images, test at the end) as whole processes, side by side:

* ``mirrorfit-tf``: ``mirrorfit train`` (the TensorFlow engine, the default);
* ``mirrorfit-jax``: ``mirrorfit train --backend jax``;
* ``keras-jax``: what a Keras 3 user on the JAX backend runs: ``fit`` with
  ``steps_per_execution=50``, the same model, batch, epochs and validation, then ``evaluate``,
  in this environment (``keras.utils.set_random_seed`` imports TensorFlow where it is installed,
  as it is here);
* ``keras-jax-notf``: the same on a machine without TensorFlow (its import blocked).

Each run is its own process, timed from start to exit; the sides alternate (the order rotates
each repeat) and the medians are compared. The mirrorfit sides write ``--metrics-out``, whose
``timings_s`` say where the time went; the Keras sides print theirs. Usage::

    .venv/bin/python benchmarks/default_job.py --repeats 5
    .venv/bin/python benchmarks/default_job.py --repeats 3 --sides mirrorfit-tf,keras-jax \\
        --compare-src /path/to/an/older/checkout/src     # adds "mirrorfit-tf@older"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("mirrorfit-tf", "mirrorfit-jax", "keras-jax", "keras-jax-notf")

KERAS_FIT = textwrap.dedent("""
    import os, sys, time, json
    start = time.perf_counter()
    if sys.argv[1] == "notf":
        sys.modules["tensorflow"] = None  # a machine without TensorFlow
    os.environ["KERAS_BACKEND"] = "jax"
    import numpy as np, keras
    t_import = time.perf_counter()
    from mirrorfit.data.mnist import locate_mnist
    with np.load(locate_mnist(download=False)) as f:
        x, y, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    x, x_test = x.astype("float32") / 255.0, x_test.astype("float32") / 255.0
    x_val, y_val, x, y = x[:5000], y[:5000], x[5000:], y[5000:]
    t_data = time.perf_counter()
    keras.utils.set_random_seed(42)
    model = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(),
                              keras.layers.Dense(100, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], steps_per_execution=50)
    t_model = time.perf_counter()
    model.fit(x, y, batch_size=32, epochs=10, validation_data=(x_val, y_val), verbose=0)
    t_fit = time.perf_counter()
    _, accuracy = model.evaluate(x_test, y_test, batch_size=32, verbose=0)
    t_test = time.perf_counter()
    print(json.dumps({"test_accuracy": accuracy, "timings_s": {
        "import": t_import - start, "data": t_data - t_import, "model": t_model - t_data,
        "fit": t_fit - t_model, "test": t_test - t_fit}}))
""")


def run_side(side: str, compare_src: str | None) -> dict:
    """One whole process of ``side``: wall seconds, test accuracy and its timings."""
    env = dict(os.environ)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell has it
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "m.json"
        if side.startswith("mirrorfit"):
            cmd = [
                sys.executable,
                "-m",
                "mirrorfit",
                "train",
                "--no-progress",
                "--metrics-out",
                str(metrics),
            ]
            if side == "mirrorfit-jax":
                cmd += ["--backend", "jax"]
            if side.endswith("@older"):
                env["PYTHONPATH"] = compare_src
                cmd.remove("--metrics-out")
                cmd.remove(str(metrics))
        else:
            cmd = [sys.executable, "-c", KERAS_FIT, "notf" if side.endswith("notf") else "tf"]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{side} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        if side.startswith("mirrorfit") and metrics.exists():
            summary = json.loads(metrics.read_text())
            out = {
                "test_accuracy": summary["test_accuracy"],
                "timings_s": summary.get("timings_s", {}),
            }
        elif side.startswith("mirrorfit"):
            line = [ln for ln in proc.stderr.splitlines() if ln.startswith("done:")][-1]
            # "test accuracy 0.9511" ends the line, or is followed by ", loss 0.1706"
            accuracy = line.rsplit("test accuracy ", 1)[1].split(",")[0]
            out = {"test_accuracy": float(accuracy), "timings_s": {}}
        else:
            out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, **out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument(
        "--compare-src",
        help="an older checkout's src/ folder: adds a "
        "mirrorfit-tf@older side run from it (PYTHONPATH)",
    )
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    if args.compare_src:
        sides.append("mirrorfit-tf@older")
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for r in range(args.repeats):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]  # rotate: no side always first
        for side in order:
            result = run_side(side, args.compare_src)
            runs[side].append(result)
            print(
                f"repeat {r + 1} {side}: {result['wall_s']:.2f} s, test accuracy "
                f"{result['test_accuracy']:.4f}",
                flush=True,
            )
    print("\nmedians over", args.repeats, "repeats (whole process, seconds):")
    medians = {s: statistics.median(x["wall_s"] for x in v) for s, v in runs.items()}
    for side, results in runs.items():
        walls = sorted(x["wall_s"] for x in results)
        phases = sorted({k for x in results for k in x["timings_s"]})
        breakdown = ", ".join(
            f"{k} {statistics.median(x['timings_s'].get(k, 0) for x in results):.2f}"
            for k in phases
        )
        print(
            f"  {side:18} {medians[side]:6.2f} s [{walls[0]:.2f}-{walls[-1]:.2f}]"
            f"  accuracy {statistics.median(x['test_accuracy'] for x in results):.4f}"
            + (f"\n  {'':18} {breakdown}" if breakdown else "")
        )
    print("\nspeed against each Keras side (its median time / this side's; > 1: faster):")
    for base in [s for s in sides if s.startswith("keras")]:
        for side in [s for s in sides if s.startswith("mirrorfit")]:
            print(f"  {side} vs {base}: {medians[base] / medians[side]:.2f}x")
    if "mirrorfit-tf" in medians and "mirrorfit-jax" in medians:
        print(
            f"  mirrorfit-jax vs mirrorfit-tf: "
            f"{medians['mirrorfit-tf'] / medians['mirrorfit-jax']:.2f}x"
        )


if __name__ == "__main__":
    main()
