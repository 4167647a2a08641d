"""What `--shard` costs and saves on the JAX engine: examples/s and state bytes per device of
`mirrorfit.fit` under `none`, `optimizer` and `all` on the CNN and a wide MLP, and of Keras's own
`keras.distribution.ModelParallel` (a `LayoutMap` splitting the same kernels over the same
devices, data parallel along the same axis: FSDP by the compiler's partitioner), all in one
process on N devices (logical CPU devices where there is no GPU).

Every side is built and compiled first; then each repeat trains one epoch of each, in an order
that rotates every repeat, and the medians of the repeats are compared.

Usage::

    .venv/bin/python benchmarks/sharding.py --replicas 4 --width 1024 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.modules.setdefault("tensorflow", None)  # the JAX engine alone
os.environ["KERAS_BACKEND"] = "jax"

MODES = ("none", "optimizer", "all")


def wide_mlp(width: int, classes: int = 16):
    import keras

    def build():
        x = inputs = keras.Input((width,))
        for _ in range(8):
            x = keras.layers.Dense(width, activation="relu")(x)
        return keras.Model(inputs, keras.layers.Dense(classes)(x))

    return build


def _data(model: str, width: int, examples: int):
    import numpy as np

    rng = np.random.default_rng(0)
    if model == "cnn":
        return (
            rng.integers(0, 256, (examples, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, examples).astype(np.int32),
        )
    return (
        rng.normal(size=(examples, width)).astype(np.float32),
        rng.integers(0, 16, examples).astype(np.int32),
    )


def _ours(setup, model: str, width: int, batch: int, data):
    """{mode: (train one more epoch, state bytes per device)}: ``mirrorfit.fit`` of the model
    compiled with Adam under each ``--shard`` mode."""
    import keras

    import mirrorfit
    from mirrorfit.engine.jax.placement import build_placement
    from mirrorfit.fitting.loop import runner_of
    from mirrorfit.fitting.setup import Setup, use

    x, y = data
    if model == "cnn":  # the built-in CNN takes [0, 1] pixels
        x = x.astype("float32") / 255
    out = {}
    for mode in MODES:
        chosen = Setup(backend="jax", devices=setup, placement=build_placement(setup, shard=mode))
        use(chosen)
        net = mirrorfit.models.cnn() if model == "cnn" else wide_mlp(width)()
        net.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=model != "cnn"),
        )
        common = dict(batch_size=batch, epochs=1, verbose=0, steps_per_execution=10)
        mirrorfit.fit(net, x, y, **common)  # compiles

        def epoch(net=net, common=common, chosen=chosen):
            use(chosen)  # fit runs on the setup in use: this model's mode, not the last built
            mirrorfit.fit(net, x, y, **common)

        out[mode] = (epoch, runner_of(net).state_bytes_per_device())
    return out


def _keras_model_parallel(replicas: int, width: int, batch: int, data):
    """Keras's fit under ModelParallel: (train one more epoch, state bytes per device)."""
    import jax
    import keras
    from keras import distribution as kd

    mesh = kd.DeviceMesh((replicas,), ["batch"], devices=kd.list_devices()[:replicas])
    layout = kd.LayoutMap(mesh)
    layout["dense.*kernel"] = ("batch", None)  # the kernels split along their first axis
    dist = kd.ModelParallel(layout_map=layout, batch_dim_name="batch")
    with dist.scope():
        model = wide_mlp(width)()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        x, y = data
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # compiles

    def epoch():
        with dist.scope():
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)

    held: dict = {}
    for v in [*model.variables, *model.optimizer.variables]:
        value = v.value
        for shard in value.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    del jax
    return epoch, max(held.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--width", type=int, default=1024, help="the wide MLP's units per layer")
    p.add_argument("--examples", type=int, default=2560)
    p.add_argument("--batch", type=int, default=128, help="global batch")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", default="mlp,cnn")
    a = p.parse_args()
    from mirrorfit.engine import jax as engine

    setup = engine.configure_devices(replicas=a.replicas)
    for model in a.models.split(","):
        data = _data(model, a.width, a.examples)
        sides = _ours(setup, model, a.width, a.batch, data)
        if model == "mlp":
            sides["keras-ModelParallel"] = _keras_model_parallel(a.replicas, a.width, a.batch, data)
        names = list(sides)
        rates: dict[str, list[float]] = {n: [] for n in names}
        for rep in range(a.repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                start = time.perf_counter()
                sides[name][0]()
                rates[name].append(a.examples // a.batch * a.batch / (time.perf_counter() - start))
        base = statistics.median(rates["none"])
        label = f"MLP 8 x Dense({a.width})" if model == "mlp" else "CNN"
        print(
            f"{label}, Adam, global batch {a.batch}, {a.replicas} devices "
            f"({setup.handles[0].platform}), median of {a.repeats}:"
        )
        for name in names:
            rate = statistics.median(rates[name])
            print(
                f"  {name:>19}: {rate:10,.0f} examples/s ({rate / base:.3f}x none), "
                f"{sides[name][1] / 2**20:8.1f} MiB state per device "
                f"({sides[name][1] / sides['none'][1]:.3f}x none)"
            )
        if "keras-ModelParallel" in rates:
            ours = statistics.median(rates["all"])
            print(
                f"  all / keras-ModelParallel: "
                f"{ours / statistics.median(rates['keras-ModelParallel']):.3f}x"
            )


if __name__ == "__main__":
    main()
