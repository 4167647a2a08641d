"""A KerasHub causal LM with LoRA (Gemma from its config, random weights: tests/engine/jax/
hub_lm.py) fine-tuned on 4 logical CPU devices: ``mirrorfit.fit`` with the state whole on
every device (``none``), split (``all``) and on a 2 x 2 data x model mesh (``grid``; with ZeRO
over its data axis: ``grid-optimizer``, ``grid-all``), beside
Keras's own ``fit`` under ``ModelParallel`` with the backbone's ``get_layout_map`` on the same
2 x 2 mesh (``keras-mp``). Each side is its own process; the order turns each repeat; steady
examples/s (every epoch but the first) and the largest live bytes one device holds after fit
(JAX's accounting), medians compared with ``none``'s.

Usage::

    .venv/bin/python benchmarks/hub_lm.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROGRAM = Path(__file__).resolve().parents[1] / "tests" / "engine" / "jax" / "hub_lm.py"
SIDES = ("none", "all", "grid", "grid-optimizer", "grid-all", "keras-mp")


def run_side(side: str, examples: int, epochs: int, optimizer: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, str(PROGRAM), side, str(out), str(examples), str(epochs), optimizer]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{side} failed: {proc.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.with_suffix(".json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--examples", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    args = parser.parse_args()
    seen: dict[str, dict[str, list]] = {s: {"rate": [], "bytes": []} for s in SIDES}
    for r in range(args.repeats):
        order = SIDES if r % 2 == 0 else SIDES[::-1]
        for side in order:
            got = run_side(side, args.examples, args.epochs, args.optimizer)
            seen[side]["rate"].append(got["examples_per_sec"])
            seen[side]["bytes"].append(got["live_bytes"])
            print(
                f"repeat {r + 1} {side}: {got['examples_per_sec']:,.0f} examples/s, "
                f"{got['live_bytes'] / 2**20:.2f} MiB on the fullest device",
                flush=True,
            )
    base_rate = statistics.median(seen["none"]["rate"])
    base_bytes = statistics.median(seen["none"]["bytes"])
    print(f"\nmedians of {args.repeats}, against mirrorfit none:")
    for side in SIDES:
        rate, held = (statistics.median(seen[side][k]) for k in ("rate", "bytes"))
        print(
            f"  {side:>8}: {rate:,.0f} examples/s ({rate / base_rate:.2f}x), "
            f"{held / 2**20:.2f} MiB per device ({held / base_bytes:.2f}x)"
        )


if __name__ == "__main__":
    main()
