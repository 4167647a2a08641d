"""Parameter servers through both doors, side by side: ``mirrorfit launch --workers 2 --ps 1 --
mirrorfit train --strategy parameter-server`` with the built-in ``--model mlp`` (compiled by
``train`` from its flags; until the one loop, the earlier loop's per-worker tf.data pipelines)
against the same model compiled by the user (``--model ps_fit:compiled_mlp``: Rescaling,
then the chapter's MLP, SGD), both trained through ``mirrorfit.fit``'s loop, each call's
steps scheduled with their block. Steady examples/s from
``--metrics-out``; the sides alternate each repeat and the medians are compared.

    .venv/bin/python benchmarks/ps_fit.py --repeats 3 --epochs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = {"built-in": "mlp", "fit": "ps_fit:compiled_mlp"}


def compiled_mlp():
    """The built-in ``mlp``, its pixels scaled in the model, compiled with the built-in loop's
    defaults (SGD 0.01, sparse categorical crossentropy, accuracy)."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((28, 28)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(100, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="compiled_mlp",
    )
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def run_side(side: str, args, folder: Path) -> dict:
    out = folder / f"{side}.json"
    argv = [sys.executable, "-m", "mirrorfit", "launch", "--workers", str(args.workers)]
    argv += ["--ps", "1", "--", "mirrorfit", "train", "--model", SIDES[side]]
    argv += ["--strategy", "parameter-server", "--epochs", str(args.epochs), "--no-progress"]
    argv += ["--batch-size", str(args.batch), "--steps-per-execution", str(args.steps)]
    argv += ["--metrics-out", str(out)]
    env = {**__import__("os").environ, "PYTHONPATH": str(HERE)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=100, help="steps per execution")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    accuracy: dict[str, list[float]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
            for side in order:
                summary = run_side(side, args, Path(tmp))
                rates[side].append(summary["train_examples_per_sec"])
                accuracy[side].append(summary["test_accuracy"])
                print(
                    f"repeat {r + 1} {side}: {summary['train_examples_per_sec']:,.0f} "
                    f"examples/s, test accuracy {summary['test_accuracy']:.4f}",
                    flush=True,
                )
    medians = {side: statistics.median(v) for side, v in rates.items()}
    for side in SIDES:
        print(
            f"{side}: median {medians[side]:,.0f} examples/s, test accuracy "
            f"{statistics.median(accuracy[side]):.4f}"
        )
    print(f"fit / built-in: {medians['fit'] / medians['built-in']:.2f}x")


if __name__ == "__main__":
    main()
