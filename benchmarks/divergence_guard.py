"""What the NaN check costs: `mirrorfit train` with its divergence guard (the default: the
training loss read after every compiled call) against `--allow-nan` (no guard), steady
examples/s from `--metrics-out`. Each run is its own process; the two sides alternate each
repeat and the medians are compared. `--steps-per-execution 1` is the worst case (one read
per step); the default 50 reads once per 50 steps.

Usage::

    .venv/bin/python benchmarks/divergence_guard.py --backend jax --repeats 5 --spe 1
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


def _run(backend: str, spe: int, epochs: int, guarded: bool, out: Path) -> float:
    args = [
        sys.executable,
        "-m",
        "mirrorfit",
        "train",
        "--backend",
        backend,
        "--epochs",
        str(epochs),
        "--steps-per-execution",
        str(spe),
        "--train-examples",
        "20000",
        "--no-progress",
        "--metrics-out",
        str(out),
    ] + ([] if guarded else ["--allow-nan"])
    subprocess.run(
        args,
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    return json.loads(out.read_text())["train_examples_per_sec"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="jax")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--spe", type=int, default=1, help="--steps-per-execution")
    p.add_argument("--epochs", type=int, default=3)
    a = p.parse_args()
    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            for guarded in (True, False) if rep % 2 == 0 else (False, True):
                rates[guarded].append(
                    _run(a.backend, a.spe, a.epochs, guarded, Path(tmp) / "m.json")
                )
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    pairs = [g / u for g, u in zip(rates[True], rates[False])]
    print(
        f"{a.backend}, --steps-per-execution {a.spe}: guarded {on:,.0f} examples/s, "
        f"--allow-nan {off:,.0f} examples/s; guarded/unguarded {on / off:.3f} "
        f"(median of per-pair ratios {statistics.median(pairs):.3f}, {a.repeats} repeats)"
    )


if __name__ == "__main__":
    main()
