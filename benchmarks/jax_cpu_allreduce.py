"""What one training step's all-reduce costs on logical CPU devices under JAX, for the
chapter's MLP (Flatten -> Dense(100, relu) -> Dense(10): 79,510 parameters, 318 KB of float32
gradients): why the MLP on 2 logical devices runs slower than on 1 (the JAX issue's target was
>= 0.9x).

The same step written in plain JAX (no Keras, no mirrorfit: only XLA's CPU client), 50 steps
per call in a ``fori_loop``, global batch 64 of MNIST, SGD; each side its own process, the
order rotating, repeated; medians of microseconds per step:

* ``1 device``: the whole batch on one device;
* ``2, gradients``: 32 examples per device and one ``psum`` of the gradients, as the engine
  does (``mirrorfit/engine/jax/step.py``);
* ``2, one scalar``: the same, but the all-reduce carries one number: what the devices'
  rendezvous alone costs (the gradients stay local: not a correct training step);
* ``2, none``: no collective at all (each device trains on its own half: not a correct
  training step): the bound for any all-reduce.

Usage (MNIST found as ``mirrorfit train`` finds it)::

    .venv/bin/python benchmarks/jax_cpu_allreduce.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIDES = {
    "1 device": (1, "psum"),
    "2, gradients": (2, "psum"),
    "2, one scalar": (2, "scalar"),
    "2, none": (2, "none"),
}
BATCH, STEPS, CALLS = 64, 50, 10


def measure(devices: int, collective: str, rounds: int) -> float:
    """Median microseconds per step over ``rounds`` timings of ``CALLS`` calls (run in a fresh
    process: the device count is fixed when JAX starts)."""
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={devices}"
    )
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import mirrorfit

    data = mirrorfit.load_mnist(download=False)
    x = data.x_train[: STEPS * BATCH].reshape(STEPS, BATCH, -1)
    y = data.y_train[: STEPS * BATCH].reshape(STEPS, BATCH).astype(np.int32)
    rng = np.random.default_rng(0)
    params = [
        jnp.asarray((rng.normal(size=s) * 0.05).astype(np.float32))
        for s in ((784, 100), (100,), (100, 10), (10,))
    ]
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))

    def loss(p, xb, yb):
        h = jax.nn.relu(xb @ p[0] + p[1])
        logp = jax.nn.log_softmax(h @ p[2] + p[3])
        return -jnp.sum(jnp.take_along_axis(logp, yb[:, None], 1)) / BATCH

    def per_device(p, xs, ys, n):
        def step(i, p):
            local = [
                jax.lax.pcast(t, "data", to="varying")
                if hasattr(jax.lax, "pcast")
                else jax.lax.pvary(t, "data")
                for t in p
            ]
            g = jax.grad(loss)(local, xs[i].astype(jnp.float32) / 255.0, ys[i])
            if collective == "psum":
                g = jax.lax.psum(g, "data")
            elif collective == "scalar":
                z = jax.lax.psum(g[3][0], "data")
                g = [a + 0 * z for a in g]
            return [a - 0.01 * b for a, b in zip(p, g)]

        return jax.lax.fori_loop(0, n, step, p)

    # The type check refuses the incorrect sides (their results differ by device); the
    # correct one keeps it.
    train = jax.jit(
        jax.shard_map(
            per_device,
            mesh=mesh,
            in_specs=(P(), P(None, "data"), P(None, "data"), P()),
            out_specs=P(),
            check_vma=collective == "psum",
        ),
        donate_argnums=0,
    )
    xs, ys = jnp.asarray(x), jnp.asarray(y)
    params = jax.block_until_ready(train(params, xs, ys, STEPS))  # compile
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(CALLS):
            params = train(params, xs, ys, STEPS)
        jax.block_until_ready(params)
        times.append((time.perf_counter() - start) / (CALLS * STEPS) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="processes per side")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps({"us_per_step": measure(*SIDES[args.side], rounds=7)}))
        return
    names = list(SIDES)
    per_side: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate the order
        for name in order:
            out = subprocess.run(
                [sys.executable, __file__, "--side", name],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            per_side[name].append(json.loads(out.strip().splitlines()[-1])["us_per_step"])
            print(f"  {name:14s} {per_side[name][-1]:7.0f} us/step", flush=True)
    one = statistics.median(per_side["1 device"])
    print(f"\nmedians of {args.repeats} processes per side; examples/s against 1 device:")
    for name in names:
        med = statistics.median(per_side[name])
        print(
            f"  {name:14s} {med:7.0f} us/step  [{min(per_side[name]):.0f}-"
            f"{max(per_side[name]):.0f}]  {one / med:.2f}x"
        )


if __name__ == "__main__":
    main()
