"""A keras.applications network on synthetic data: mirrorfit on 1 and 2 replicas vs Keras fit.

The figures of a network of realistic size (ResNet50 by default), with no input pipeline in the
way: every side trains on the same random batch, made once and repeated (as TensorFlow's and
Horovod's synthetic benchmarks do), with the same model, global batch, optimizer (SGD) and
precision. Sides:

- ``keras fit x1``: Keras ``model.fit`` on one device (the textbook recipe at one replica);
- ``mirrorfit x1``: mirrorfit's compiled multi-step loop on one device;
- ``mirrorfit x2``: the same on 2 replicas (on a CPU-only host, 2 logical devices sharing the
  same cores, so the ideal is 1.0x one replica: the ratio is the cost of distributing).

Each run is its own process (logical devices are fixed at TensorFlow start-up); sides alternate
and repeat, because this machine is shared and noisy. Throughput is examples over the wall time
of epochs 2..E (epoch 1 traces and compiles), as mirrorfit.bench.point measures it for both
sides. MFU = training FLOPs per example (3 x the forward pass, counted from the model) x
examples/s / the matmul peak measured in this run. Prints medians [min-max] and the ratios.

    python benchmarks/applications.py [--model ResNet50] [--input-shape 224,224,3]
        [--num-classes 1000] [--global-batch-size 32] [--steps 5] [--epochs 2] [--repeats 3]
        [--precision fp32] [--probe]

``--probe`` runs one mirrorfit x1 point of 2 epochs x 1 step and prints the seconds per step,
to size ``--steps`` and ``--repeats`` before a long run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from mirrorfit.bench.grid import spawn
from mirrorfit.bench.point import Point
from mirrorfit.models.precision import COMPUTE_DTYPES


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ResNet50")
    p.add_argument("--input-shape", type=_shape, default=(224, 224, 3))
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--global-batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="optimizer steps per epoch")
    p.add_argument("--epochs", type=int, default=2, help="epoch 1 compiles; 2.. are timed")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--probe", action="store_true", help="time one step and stop")
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    batch = a.global_batch_size
    base = Point(
        kind="mirrorfit",
        model=a.model,
        global_batch=batch,
        train_examples=a.steps * batch,
        epochs=a.epochs,
        data="synthetic",
        input_shape=a.input_shape,
        num_classes=a.num_classes,
        precision=a.precision,
        steps_per_execution=a.steps,
    )
    shape = "x".join(map(str, a.input_shape))
    started = time.perf_counter()
    if a.probe:
        probe = Point(**{**base.__dict__, "train_examples": batch})
        result = spawn(probe)
        if "error" in result:
            sys.exit(f"probe failed: {result['error']}")
        step_s = batch / result["examples_per_sec"]
        print(
            f"{a.model} {shape}, batch {batch}, {a.precision}: {step_s:.2f} s per step "
            f"(mirrorfit x1); probe took {time.perf_counter() - started:.0f} s"
        )
        return

    flops = _train_flops(a.model, a.input_shape, a.num_classes)
    peak = spawn(Point(kind="peak"))
    if "error" in peak:
        sys.exit(f"measuring the matmul peak failed: {peak['error']}")
    peak_flops = peak[COMPUTE_DTYPES[a.precision]]
    sides = {
        "keras fit x1": Point(**{**base.__dict__, "kind": "textbook", "replicas": 1}),
        "mirrorfit x1": Point(**{**base.__dict__, "replicas": 1}),
        "mirrorfit x2": Point(**{**base.__dict__, "replicas": 2}),
    }
    runs: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for rep in range(a.repeats):
        for name in names if rep % 2 == 0 else names[::-1]:  # alternate the order
            t0 = time.perf_counter()
            result = spawn(sides[name])
            if "error" in result:
                sys.exit(f"{name} failed: {result['error']}")
            runs[name].append(result["examples_per_sec"])
            print(
                f"  {name:13} run {rep + 1}: {result['examples_per_sec']:8.2f} examples/s "
                f"({time.perf_counter() - t0:.0f} s with start-up and compile)",
                flush=True,
            )
    print(
        f"\n{a.model} at {shape}, {a.num_classes} classes, synthetic data; global batch {batch}, "
        f"{a.precision}, SGD; {a.steps} steps per epoch, {a.epochs} epochs (epoch 1 not "
        f"timed); {a.repeats} runs per side (median [min-max]); "
        f"{os.cpu_count()} cores, logical CPU devices share them"
    )
    print(
        f"  training FLOPs per example: {flops / 1e9:.2f} GFLOP (3 x forward); matmul peak "
        f"{peak_flops / 1e9:.1f} GFLOP/s ({COMPUTE_DTYPES[a.precision]}, measured now)"
    )
    med = {}
    for name, rates in runs.items():
        med[name] = statistics.median(rates)
        mfu = flops * med[name] / peak_flops
        print(
            f"  {name:13}: {med[name]:8.2f} examples/s [{min(rates):.2f}-{max(rates):.2f}]  "
            f"step {1e3 * batch / med[name]:8.0f} ms  MFU {mfu:.1%}"
        )
    for top, bottom, target in (
        ("mirrorfit x2", "mirrorfit x1", 0.97),
        ("mirrorfit x2", "keras fit x1", 1.0),
        ("mirrorfit x1", "keras fit x1", None),
    ):
        ratio = med[top] / med[bottom]
        goal = (
            ""
            if target is None
            else f"  (target >= {target:.2f}x: {'met' if ratio >= target else 'NOT met'})"
        )
        print(f"  ratio {top} / {bottom}: {ratio:.3f}x{goal}")
    print(f"  benchmark wall time: {time.perf_counter() - started:.0f} s", flush=True)


def _train_flops(model: str, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Training FLOPs per example, counted in this process (the runs are other processes)."""
    import keras

    from mirrorfit.bench.flops import train_flops_per_example
    from mirrorfit.models.build import model_factory

    flops = train_flops_per_example(
        model_factory(model, input_shape=input_shape, num_classes=num_classes)()
    )
    keras.backend.clear_session()  # free the model: the runs need the memory
    return flops


if __name__ == "__main__":
    main()
