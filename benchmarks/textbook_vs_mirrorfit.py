"""The textbook recipe (Keras fit under MirroredStrategy) vs mirrorfit, side by side.

Each run is its own process (logical devices are fixed at TensorFlow start-up). Sides alternate
and repeat, because this machine is shared and noisy; we report medians, the spread, and ratios
of medians. Throughput is wall time over epochs 2..E (epoch 1 traces and compiles), measured the
same way on both sides (mirrorfit.bench.point). `mirrorfit bench` runs wider grids.

    python benchmarks/textbook_vs_mirrorfit.py --data-dir ../shared/data [--repeats 3]
        [--models mlp,cnn] [--precision fp32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from mirrorfit.bench.grid import WORKLOADS, spawn
from mirrorfit.bench.point import Point


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MIRRORFIT_DATA", "../shared/data"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--precision", default="fp32", help="mirrorfit's precision (textbook: fp32)")
    a = p.parse_args()
    data_dir = os.path.abspath(a.data_dir)
    for model in a.models.split(","):
        batch, n_train, epochs = WORKLOADS[model]
        base = Point(
            kind="mirrorfit",
            model=model,
            global_batch=batch,
            train_examples=n_train,
            epochs=epochs,
            data_dir=data_dir,
            precision=a.precision,
        )
        sides = {
            "textbook x2": Point(
                **{**base.__dict__, "kind": "textbook", "replicas": 2, "precision": "fp32"}
            ),
            "mirrorfit x2": Point(**{**base.__dict__, "replicas": 2}),
            "mirrorfit x1": Point(**{**base.__dict__, "replicas": 1}),
        }
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for rep in range(a.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:  # alternate the order
                result = spawn(sides[name])
                if "error" in result:
                    sys.exit(f"{model} {name} failed: {result['error']}")
                runs[name].append(result)
                print(
                    f"  {model} {name:13} run {rep + 1}: {result['examples_per_sec']:9,.0f} "
                    f"examples/s  acc {result['test_accuracy']:.4f}",
                    flush=True,
                )
        print(
            f"\n{model.upper()}: global batch {batch}, {n_train or 55000} training images, "
            f"{epochs} epochs, mirrorfit in {a.precision}, {a.repeats} runs per side "
            "(median [min-max])"
        )
        med = {}
        for name, results in runs.items():
            rates = [r["examples_per_sec"] for r in results]
            med[name] = statistics.median(rates)
            acc = statistics.median(r["test_accuracy"] for r in results)
            print(
                f"  {name:13}: {med[name]:9,.0f} examples/s [{min(rates):,.0f}-"
                f"{max(rates):,.0f}]  test accuracy {acc:.4f}"
            )
        print(
            f"  ratio mirrorfit / textbook (2 replicas): "
            f"{med['mirrorfit x2'] / med['textbook x2']:.2f}x"
        )
        print(
            f"  ratio mirrorfit 2 replicas / 1 replica:   "
            f"{med['mirrorfit x2'] / med['mirrorfit x1']:.2f}x\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
