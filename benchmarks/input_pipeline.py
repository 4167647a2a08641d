"""An image-folder run with and without the pipeline options, side by side.

Writes N MNIST training images as PNG files in one subfolder per class (the layout of
keras.utils.image_dataset_from_directory), then runs `mirrorfit train --data FOLDER --profile`
with each variant in its own process: files decoded every step (the default), and `--cache
memory` (each image decoded once, before the first epoch). Variants alternate and repeat (this
machine is shared and noisy); we report medians: steady examples/s, the share of step time spent
waiting for input (--profile), the whole process's wall time (start-up and, with the cache,
decoding every image once included), and ratios to the default.

    python benchmarks/input_pipeline.py [--images 10000] [--repeats 3] [--model mlp]
        [--epochs 3] [--global-batch-size 128] [--replicas 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from data_fixtures import mnist, write_png_folder  # noqa: E402  (the tests' PNG writer)

VARIANTS = {"decoded every step": [], "--cache memory": ["--cache", "memory"]}


def run(folder: Path, extra: list[str], a: argparse.Namespace, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "mirrorfit.cli",
        "train",
        "--data",
        str(folder),
        "--model",
        a.model,
        "--epochs",
        str(a.epochs),
        "--global-batch-size",
        str(a.global_batch_size),
        "--replicas",
        str(a.replicas),
        "--optimizer",
        "adam",
        "--lr",
        "0.001",
        "--validation-split",
        "0.1",
        "--profile",
        "--no-progress",
        "--metrics-out",
        str(out),
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    )
    wall = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads(out.read_text())
    return {
        "examples_per_sec": summary["train_examples_per_sec"],
        "input_wait": summary["profile"]["fractions"]["input_wait"],
        "input_batch_ms": summary["profile"]["input_batch_s"] * 1e3,
        "val_accuracy": summary["val_accuracy"],
        "wall_s": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="mlp")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--global-batch-size", type=int, default=128)
    p.add_argument("--replicas", type=int, default=1)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "mnist-png"
        x, y = mnist(a.images)
        t0 = time.perf_counter()
        write_png_folder(folder, x, y)
        print(
            f"{a.images:,} PNGs written to {folder} in {time.perf_counter() - t0:.1f} s "
            f"({sum(f.stat().st_size for f in folder.rglob('*.png')) / 2**20:.1f} MiB)",
            flush=True,
        )
        runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for rep in range(a.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:  # alternate the order
                r = run(folder, VARIANTS[name], a, Path(tmp) / "m.json")
                runs[name].append(r)
                print(
                    f"  {name:19} run {rep + 1}: {r['examples_per_sec']:8,.0f} examples/s, "
                    f"input wait {r['input_wait']:.0%}, wall {r['wall_s']:.1f} s",
                    flush=True,
                )
    print(
        f"\n{a.model}, {a.images:,} PNG images (90% train), global batch "
        f"{a.global_batch_size}, {a.replicas} replica(s), {a.epochs} epochs, "
        f"{os.cpu_count()} cores; medians of {a.repeats} runs [min-max]"
    )
    base = statistics.median(r["examples_per_sec"] for r in runs[names[0]])
    base_wall = statistics.median(r["wall_s"] for r in runs[names[0]])
    for name, results in runs.items():
        rates = [r["examples_per_sec"] for r in results]
        med = statistics.median(rates)
        wait = statistics.median(r["input_wait"] for r in results)
        wall = statistics.median(r["wall_s"] for r in results)
        batch = statistics.median(r["input_batch_ms"] for r in results)
        acc = statistics.median(r["val_accuracy"] for r in results)
        print(
            f"  {name:19}: {med:8,.0f} examples/s [{min(rates):,.0f}-{max(rates):,.0f}] "
            f"({med / base:.2f}x), input wait {wait:.0%}, pipeline alone {batch:.1f} ms per "
            f"batch, wall {wall:.1f} s ({wall / base_wall:.2f}x), val accuracy {acc:.4f}"
        )


if __name__ == "__main__":
    main()
