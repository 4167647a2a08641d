"""How long training waits on a checkpoint: `--shard none`'s synchronous `state.npz` against
the sharded runs' Orbax saves, which return once the state is off the devices and finish in
the background. One process on N devices (logical CPU devices where there is no GPU), a wide
MLP with Adam (8 x Dense(1024): about 100 MB of weights and optimizer state).

For each side, two figures per save, medians over the repeats:
- blocked: the time `Checkpointer.save()` holds the training thread, of which "own" is the
  save itself and the rest waiting for the previous save to commit;
- cost: an epoch that saves after every execution, less the same epoch without saves, per save
  (what the saves cost in all: the blocked time, the background write competing for the CPU,
  and waiting for the last save to commit).

Epochs with and without saves alternate; the sides rotate every repeat.

Usage::

    .venv/bin/python benchmarks/checkpoint_save.py --replicas 4 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.modules.setdefault("tensorflow", None)  # the JAX engine alone
os.environ["KERAS_BACKEND"] = "jax"

SIDES = ("none", "optimizer", "all")

from sharding import wide_mlp  # noqa: E402 - beside this script


def _side(setup, mode: str, a, batches, folder: str):
    """(one epoch without saves, one epoch saving after every execution -> blocked times,
    state bytes per device)."""
    import keras

    import mirrorfit
    from mirrorfit.artifacts.checkpoint import Checkpointer
    from mirrorfit.engine.jax.placement import build_placement

    trainer = mirrorfit.Trainer(
        strategy=build_placement(setup, shard=mode),
        model=wide_mlp(a.width),
        optimizer=keras.optimizers.Adam(1e-4),
        global_batch=a.batch,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=a.steps_per_execution,
    )
    trainer.fit(batches, epochs=1)  # compiles
    checkpointer = Checkpointer(
        os.path.join(folder, mode), trainer=trainer, model_spec="wide", keep=2, data=batches.order
    )
    checkpointer.save()  # Orbax's first save sets itself up
    checkpointer.wait()

    def plain():
        trainer.fit(batches, epochs=trainer.epoch + 1)

    def saving() -> list[tuple[float, float]]:
        blocked = []

        def hook(t):
            start = time.perf_counter()
            checkpointer.wait()  # what save() waits for first, timed apart
            middle = time.perf_counter()
            checkpointer.save()
            end = time.perf_counter()
            blocked.append((end - start, end - middle))

        trainer.fit(batches, epochs=trainer.epoch + 1, hooks=[hook])
        checkpointer.wait()  # the last save committed: inside the epoch's time
        return blocked

    return plain, saving, trainer.runner.state_bytes_per_device()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--width", type=int, default=1024, help="the wide MLP's units per layer")
    p.add_argument("--batch", type=int, default=256, help="global batch")
    p.add_argument("--steps-per-execution", type=int, default=10)
    p.add_argument("--executions", type=int, default=4, help="per epoch (one save each)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    import numpy as np

    import mirrorfit
    from mirrorfit.engine import jax as engine

    setup = engine.configure_devices(replicas=a.replicas)
    examples = a.batch * a.steps_per_execution * a.executions
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, a.width)).astype(np.float32)
    y = rng.integers(0, 16, examples).astype(np.int32)
    batches = mirrorfit.train_batches(x, y, global_batch=a.batch, seed=1)
    with tempfile.TemporaryDirectory(prefix="mirrorfit-ckpt-bench-") as folder:
        sides = {mode: _side(setup, mode, a, batches, folder) for mode in SIDES}
        blocked: dict[str, list[float]] = {m: [] for m in SIDES}
        own: dict[str, list[float]] = {m: [] for m in SIDES}
        cost: dict[str, list[float]] = {m: [] for m in SIDES}
        for rep in range(a.repeats):
            for mode in SIDES[rep % 3 :] + SIDES[: rep % 3]:
                plain, saving, _ = sides[mode]
                start = time.perf_counter()
                plain()
                without = time.perf_counter() - start
                start = time.perf_counter()
                times = saving()
                with_saves = time.perf_counter() - start
                blocked[mode].extend(b for b, _ in times)
                own[mode].extend(o for _, o in times)
                cost[mode].append((with_saves - without) / len(times))
    base_blocked = statistics.median(blocked["none"])
    base_cost = statistics.median(cost["none"])
    state = sides["none"][2]
    print(
        f"MLP 8 x Dense({a.width}), Adam: {state / 2**20:.0f} MiB of state in all; "
        f"{a.replicas} devices ({setup.handles[0].platform}), a save every "
        f"{a.steps_per_execution} steps of {a.batch}, median of {a.repeats} epochs of "
        f"{a.executions} saves:"
    )
    for mode in SIDES:
        kind = "state.npz, synchronous" if mode == "none" else "Orbax, in the background"
        b, c = statistics.median(blocked[mode]), statistics.median(cost[mode])
        mine = statistics.median(own[mode])
        print(
            f"  --shard {mode:>9} ({kind}): blocked {1e3 * b:7.1f} ms per save "
            f"({b / base_blocked:.3f}x none; own {1e3 * mine:.1f} ms), cost {1e3 * c:7.1f} "
            f"ms per save ({c / base_cost:.3f}x none), {sides[mode][2] / 2**20:6.1f} MiB "
            "per device"
        )


if __name__ == "__main__":
    main()
