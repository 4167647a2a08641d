"""How long `mirrorfit.fit(checkpoint_dir=, checkpoint_every=)` waits on a checkpoint of a
state split over the devices (`shard="all"`): Orbax's background save of each device's shards
(what fit writes now) against Keras's `save_weights` of the whole weights (what it wrote
before; here by handing the saver no engine state). One process on N devices (logical CPU
devices where there is no GPU), the wide MLP of benchmarks/sharding.py with Adam.

For each side, two figures per save, medians over the repeats:
- blocked: the time the saver's `save()` holds the training thread (its own write, and the
  wait for the previous background save to commit);
- cost: an epoch of `fit` that saves after every call of steps, less the same epoch without
  `checkpoint_dir`, per save (the blocked time, the background write competing for the CPU
  and the wait for the last save at the end of `fit`).

The sides alternate, and so do epochs with and without saves.

Usage::

    .venv/bin/python benchmarks/fit_checkpoint.py --replicas 4 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.modules.setdefault("tensorflow", None)  # the JAX engine alone

SIDES = ("orbax", "h5")

from sharding import wide_mlp  # noqa: E402 - beside this script


def _timed_saves(blocked: list[float]):
    """Saver.save wrapped to append each call's seconds to ``blocked``."""
    from mirrorfit.artifacts.epoch_checkpoint import Saver

    plain = Saver.save

    def save(self, model, position):
        start = time.perf_counter()
        try:
            return plain(self, model, position)
        finally:
            blocked.append(time.perf_counter() - start)

    Saver.save = save


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--width", type=int, default=1024, help="the wide MLP's units per layer")
    p.add_argument("--batch", type=int, default=256, help="global batch")
    p.add_argument("--steps-per-execution", type=int, default=10)
    p.add_argument("--executions", type=int, default=4, help="per epoch (one save each)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    import mirrorfit

    mirrorfit.setup(backend="jax", replicas=a.replicas, shard="all")
    import keras
    import numpy as np

    from mirrorfit.engine.jax import keras_fit

    examples = a.batch * a.steps_per_execution * a.executions
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, a.width)).astype(np.float32)
    y = rng.integers(0, 16, examples).astype(np.int32)
    model = wide_mlp(a.width)()
    model.compile(
        optimizer=keras.optimizers.Adam(1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    blocked: list[float] = []
    _timed_saves(blocked)
    orbax_state = keras_fit.checkpoint_state
    kw = dict(batch_size=a.batch, epochs=1, verbose=0, steps_per_execution=a.steps_per_execution)

    def epoch(side: str | None, folder: str) -> tuple[float, list[float]]:
        keras_fit.checkpoint_state = orbax_state if side == "orbax" else lambda runner: None
        saves = (
            {}
            if side is None
            else dict(checkpoint_dir=folder, checkpoint_every=a.steps_per_execution)
        )
        del blocked[:]
        start = time.perf_counter()
        mirrorfit.fit(model, x, y, **kw, **saves)
        return time.perf_counter() - start, list(blocked)

    results: dict[str, dict[str, list[float]]] = {s: {"blocked": [], "cost": []} for s in SIDES}
    with tempfile.TemporaryDirectory(prefix="mirrorfit-fit-ckpt-bench-") as root:
        runs = iter(range(10**6))
        for side in SIDES:  # compiles, and Orbax sets itself up
            epoch(side, os.path.join(root, f"warm-{side}-{next(runs)}"))
        for rep in range(a.repeats):
            for side in SIDES[rep % 2 :] + SIDES[: rep % 2]:
                without, _ = epoch(None, "")
                with_saves, times = epoch(side, os.path.join(root, f"{side}-{next(runs)}"))
                results[side]["blocked"].extend(times)
                results[side]["cost"].append((with_saves - without) / len(times))
    runner = model.__dict__["_mirrorfit_runner"][1]
    state = runner.state_bytes_per_device()
    print(
        f"mirrorfit.fit, MLP 8 x Dense({a.width}), Adam, shard='all' on {a.replicas} devices: "
        f"{state / 2**20:.1f} MiB per device; a save every {a.steps_per_execution} steps of "
        f"{a.batch}, medians of {a.repeats} epochs of {a.executions} saves:"
    )
    base = {k: statistics.median(results["h5"][k]) for k in ("blocked", "cost")}
    for side in SIDES:
        b = statistics.median(results[side]["blocked"])
        c = statistics.median(results[side]["cost"])
        kind = "Orbax shards, background" if side == "orbax" else "save_weights, whole"
        print(
            f"  {side:>5} ({kind}): blocked {1e3 * b:7.1f} ms per save ({b / base['blocked']:.3f}x"
            f" h5), cost {1e3 * c:7.1f} ms per save ({c / base['cost']:.3f}x h5)"
        )


if __name__ == "__main__":
    main()
