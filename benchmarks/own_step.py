"""Models with their own train_step through mirrorfit.fit against their own model.fit on the
same 2 logical CPU replicas (MirroredStrategy on TensorFlow, keras.distribution.DataParallel on
JAX): keras-io's VAE and its GAN (no call(), two optimizers) on both engines, on MNIST,
batch 64. The models are tests/fitting/own_steps.py's (the test checks their results
against one device's). Each side is its own process; the sides alternate each repeat; steady
examples/s (every epoch but the first, which compiles), medians compared.

Usage::

    MIRRORFIT_DATA=../shared/data .venv/bin/python benchmarks/own_step.py --backend jax
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = Path(__file__).resolve().parents[1] / "tests" / "fitting" / "own_steps.py"
SIDES = ("mirrorfit", "keras-2")


def run_side(side: str, backend: str, examples: int, epochs: int) -> dict[str, float]:
    """Steady examples/s of each model, trained by ``side``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(MODELS), backend, side, str(out), str(examples), str(epochs)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{side} failed: {proc.stderr.strip().splitlines()[-1:]}")
        results = json.loads(out.read_text())
    return {name: r["examples_per_sec"] for name, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="tensorflow", choices=("tensorflow", "jax"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, dict[str, list[float]]] = {s: {} for s in SIDES}
    for r in range(args.repeats):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            got = run_side(side, args.backend, args.examples, args.epochs)
            for name, rate in got.items():
                rates[side].setdefault(name, []).append(rate)
            shown = ", ".join(f"{n} {v:,.0f}" for n, v in got.items())
            print(f"repeat {r + 1} {side}: {shown} examples/s", flush=True)
    print(f"\n{args.backend}, medians of {args.repeats} (steady examples/s):")
    for name in rates["mirrorfit"]:
        ours, theirs = (statistics.median(rates[s][name]) for s in SIDES)
        print(f"  {name}: mirrorfit.fit {ours:,.0f}, own fit {theirs:,.0f}: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
