"""The JAX engine against Keras's own ``fit`` on JAX, and against itself on 1 device, on this
machine: ``mirrorfit bench``'s grid (each run its own process, the order alternating, repeated;
medians), the rows the JAX issue's targets name:

* the CNN on 2 logical CPU devices: mirrorfit's JAX engine vs Keras ``fit`` under
  ``keras.distribution.DataParallel`` over the same 2 devices, same model, batch and
  ``steps_per_execution`` (target >= 1.2x);
* the MLP on 2 devices vs 1 (logical devices share the same cores: the ideal is 1.0; target
  >= 0.9x).

(The default job as whole processes, against Keras on JAX and TensorFlow:
``benchmarks/default_job.py``.) Usage::

    .venv/bin/python benchmarks/jax_engine.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from mirrorfit.bench import Grid, run_bench
from mirrorfit.engine import backends


def main() -> None:
    backends.prepare("jax")  # this process counts the models' FLOPs with XLA
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the two grids' bench files")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="jax-engine-"))
    results = {}
    for name, grid in (
        (
            "cnn",
            Grid(
                model="cnn",
                backends=("jax",),
                replicas=(2,),
                precisions=("fp32",),
                repeats=args.repeats,
            ),
        ),
        (
            "mlp",
            Grid(
                model="mlp",
                backends=("jax",),
                replicas=(1, 2),
                precisions=("fp32",),
                repeats=args.repeats,
                textbook=False,
            ),
        ),
    ):
        report = run_bench(grid, out_dir=out / name)
        results[name] = {r.label: r for r in report["rows"]}
    cnn = results["cnn"]["jax x2 fp32 spe50"]
    mlp = results["mlp"]["jax x2 fp32 spe50"]
    print(
        json.dumps(
            {
                "cnn_2_devices_vs_keras_fit_data_parallel": cnn.vs_textbook,
                "cnn_examples_per_sec": cnn.examples_per_sec,
                "mlp_2_devices_vs_1": mlp.speedup_vs_1,
                "mlp_examples_per_sec": {
                    "1": results["mlp"]["jax x1 fp32 spe50"].examples_per_sec,
                    "2": mlp.examples_per_sec,
                },
                "notes": {"cnn": cnn.note, "mlp": mlp.note},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
