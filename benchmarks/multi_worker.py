"""N worker processes vs one, at the same global batch: what multi-worker training buys here.

Each side is the real product command: ``mirrorfit launch --workers N -- mirrorfit train
--strategy multi-worker --threads-per-worker T`` against ``mirrorfit train --threads-per-worker
T`` (one process, one device). Sides alternate and repeat (the machine is shared and noisy);
we print medians, the spread, the ratio of medians and each pair's ratio (the two runs of
one repeat, back to back). Throughput is mirrorfit's steady
examples/s (the first compiled execution excluded), from ``--metrics-out``.

    python benchmarks/multi_worker.py --data-dir ../shared/data [--repeats 3] [--models cnn,mlp]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# model -> (global batch, training examples, epochs, steps per execution): seconds per run
# here, enough steps that the first execution's tracing is a small part of the wall time.
# The CNN times 175 steps per run (about 35 s on 2 workers here): shorter runs moved with
# every hiccup of the shared machine.
WORKLOADS = {"cnn": (64, 6400, 2, 25), "mlp": (64, 32000, 2, 50)}


def _run(model: str, workers: int, threads: int, data_dir: str, out: Path) -> dict:
    batch, examples, epochs, spe = WORKLOADS[model]
    train = ["mirrorfit", "train", "--model", model, "--global-batch-size", str(batch),
             "--train-examples", str(examples), "--epochs", str(epochs),
             "--steps-per-execution", str(spe), "--threads-per-worker", str(threads),
             "--no-progress", "--metrics-out", str(out)]
    if workers > 1:
        cmd = [sys.executable, "-m", "mirrorfit", "launch", "--workers", str(workers), "--",
               *train, "--strategy", "multi-worker"]
    else:
        cmd = [sys.executable, "-m", "mirrorfit", *train[1:]]
    env = dict(os.environ, MIRRORFIT_DATA=data_dir, TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default=os.environ.get("MIRRORFIT_DATA", "../shared/data"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="cnn,mlp")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads-per-worker", type=int, default=1)
    a = p.parse_args()
    data_dir = os.path.abspath(a.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            sides = {f"{a.workers} workers x {a.threads_per_worker} thread": a.workers,
                     f"1 worker x {a.threads_per_worker} thread": 1}
            rates: dict[str, list[float]] = {name: [] for name in sides}
            accuracy: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(a.repeats):
                # Alternate which side goes first, so drift on the shared machine is fair.
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for name in order:
                    out = Path(tmp) / f"{model}-{sides[name]}-{r}.json"
                    summary = _run(model, sides[name], a.threads_per_worker, data_dir, out)
                    rates[name].append(summary["train_examples_per_sec"])
                    accuracy[name].append(summary["test_accuracy"])
                    print(f"  {model} {name}: {summary['train_examples_per_sec']:,.0f} "
                          f"examples/s, test accuracy {summary['test_accuracy']:.4f}",
                          flush=True)
            batch = WORKLOADS[model][0]
            print(f"{model}, global batch {batch}, {a.repeats} repeats (median, min-max):")
            for name, values in rates.items():
                print(f"  {name:22} {statistics.median(values):9,.0f} examples/s "
                      f"({min(values):,.0f}-{max(values):,.0f}), test accuracy "
                      f"{statistics.median(accuracy[name]):.4f}")
            many, one = (statistics.median(rates[n]) for n in sides)
            pairs = [m / o for m, o in zip(*rates.values())]
            print(f"  ratio {a.workers} workers / 1 worker: {many / one:.2f}x (ratio of medians);"
                  f" per pair {', '.join(f'{r:.2f}' for r in pairs)}, median "
                  f"{statistics.median(pairs):.2f}x", flush=True)


if __name__ == "__main__":
    main()
