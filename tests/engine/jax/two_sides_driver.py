"""Run by tests/engine/jax/test_jax_multi_worker.py, as each task of `mirrorfit launch
--workers 2` and as one process alone: ``python two_sides_driver.py OUT``. On JAX with
TensorFlow blocked: under a cluster (TF_CONFIG from the launcher) one device of a 2-process
mesh, else 2 devices of one process. Each run trains the MLP, evaluates 1,001 test examples in
batches of 63 and saves its weights to OUT/RUN-WORKER-WORKERS.npz. Prints one JSON line: the
runs' steps, traces, last loss and evaluation, what the process listens on (TCP), what
agree/all_equal say, and whether TensorFlow was imported."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from mirrorfit.distribute.cluster import resolve_cluster  # noqa: E402
from mirrorfit.engine import jax as engine  # noqa: E402


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
cluster = resolve_cluster()
setup = engine.configure_devices(
    replicas=None if cluster else 2, cluster=cluster, collective_timeout_s=60
)
placement = engine.build_distribution(
    setup, kind="multi-worker" if cluster else "auto", cluster=cluster
)

import keras  # noqa: E402

import mirrorfit  # noqa: E402

data = mirrorfit.load_mnist(train_examples=1024, download=False)
report = {
    "worker": placement.worker_index,
    "workers": placement.workers,
    "replicas": placement.replicas,
    "runs": {},
}
# name: (optimizer, accumulation steps, steps per execution, precision)
RUNS = {"sgd": ("sgd", 1, 4, "fp32"), "adam": ("adam", 2, 5, "bf16")}
for name, (opt, accum, spe, precision) in RUNS.items():
    engine.seed(7)
    optimizer = {"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}[opt]
    trainer = mirrorfit.Trainer(
        strategy=placement,
        model=mirrorfit.models.mlp,
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=64,
        steps_per_execution=spe,
        accum_steps=accum,
        precision=precision,
    )
    history = trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=3), epochs=2
    )
    result = trainer.evaluate((data.x_test[:1001], data.y_test[:1001]), batch_size=63)
    np.savez(
        out / f"{name}-{placement.worker_index}-{placement.workers}.npz",
        *trainer.model.get_weights(),
    )
    report["runs"][name] = {
        "steps": history.steps,
        "traced": trainer.tracing_count(),
        "loss": history.epochs[-1]["loss"],
        "eval": result,
    }
report.update(
    listening=listening(),
    agree=placement.agree(placement.worker_index == 1),
    all_equal_rank=placement.all_equal(placement.worker_index),
    all_equal_same=placement.all_equal(5),
    tensorflow=sys.modules.get("tensorflow") is not None,
)
print(json.dumps(report))
