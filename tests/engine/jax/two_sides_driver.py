"""Run by tests/engine/jax/test_jax_multi_worker.py, as each task of `mirrorfit launch
--workers 2` and as one process alone: ``python two_sides_driver.py OUT``. On JAX with
TensorFlow blocked: under a cluster (TF_CONFIG from the launcher) one device of a 2-process
mesh, else 2 devices of one process. Each run trains the MLP through ``mirrorfit.fit``,
evaluates 1,001 test examples in batches of 63 and saves its weights to
OUT/RUN-WORKER-WORKERS.npz. Prints one JSON line: the runs' steps, last loss and evaluation,
what the process listens on (TCP), what agree/all_equal say, and whether TensorFlow was
imported."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import mirrorfit  # noqa: E402


def listening():
    # the local addresses of this process's listening TCP sockets
    import ipaddress

    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in mine:
                raw = bytes.fromhex(parts[1].split(":")[0])
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                found.append(str(getattr(ip, "ipv4_mapped", None) or ip))
    return sorted(set(found))


out = Path(sys.argv[1])
JOINED = bool(os.environ.get("TF_CONFIG"))
chosen = mirrorfit.setup(
    backend="jax", **({"strategy": "multi-worker"} if JOINED else {"replicas": 2})
)
placement = chosen.distribution if JOINED else chosen.placement
worker = placement.worker_index if JOINED else 0
import keras  # noqa: E402

from mirrorfit.models.precision import Precision  # noqa: E402

data = mirrorfit.load_mnist(train_examples=1024, download=False)
x, y = data.x_train.astype("float32") / 255, data.y_train
test = (data.x_test[:1001].astype("float32") / 255, data.y_test[:1001])
report = {"worker": worker, "workers": chosen.workers, "replicas": chosen.replicas, "runs": {}}
# name: (optimizer, accumulation steps, steps per execution, precision)
RUNS = {"sgd": ("sgd", 1, 4, "fp32"), "adam": ("adam", 2, 5, "bf16")}
for name, (opt, accum, spe, precision) in RUNS.items():
    keras.utils.set_random_seed(7)
    optimizer = {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[opt]
    with Precision(precision).building():
        model = mirrorfit.models.mlp()
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    steps: list = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs, s=steps: s.append(b))
    history = mirrorfit.fit(
        model,
        x,
        y,
        batch_size=64,
        epochs=2,
        verbose=0,
        shuffle=False,
        callbacks=[count],
        steps_per_execution=spe,
        accum_steps=accum,
    )
    result = mirrorfit.evaluate(model, *test, batch_size=63, verbose=0, return_dict=True)
    np.savez(out / f"{name}-{worker}-{chosen.workers}.npz", *model.get_weights())
    report["runs"][name] = {
        "steps": int(model.optimizer.iterations.numpy()),  # optimizer steps
        "calls": len(steps),  # Keras's batch hooks: one per compiled call
        "loss": history.history["loss"][-1],
        "eval": result,
    }
report.update(
    listening=listening(),
    agree=placement.agree(worker == 1),
    all_equal_rank=placement.all_equal(worker),
    all_equal_same=placement.all_equal(5),
    tensorflow=sys.modules.get("tensorflow") is not None,
)
print(json.dumps(report))
