"""devices + strategy: logical CPU splits, strategy choice by name, clear errors."""

from conftest import run_isolated

# Logical CPU devices are what a host without GPUs offers; CUDA_VISIBLE_DEVICES="" makes a GPU
# host one of those, so this holds on both.
CODE = """
import os
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import json, mirrorfit, tensorflow as tf
assert not tf.config.list_physical_devices("GPU")
setup = mirrorfit.configure_devices(replicas=2)
out = {"devices": list(setup.devices), "shared": setup.shared_cores,
       "describe": setup.describe()}
for kind in ("auto", "mirrored", "central-storage"):
    s = mirrorfit.build_strategy(setup, kind=kind)
    out[kind] = [type(s).__name__, s.num_replicas_in_sync]
out["auto_ops"] = type(mirrorfit.build_strategy(setup)._extended._cross_device_ops).__name__
one = mirrorfit.configure_devices(replicas=1)
out["single"] = type(mirrorfit.build_strategy(one)).__name__
try:
    mirrorfit.configure_devices(replicas=3)
except mirrorfit.ConfigError as e:
    out["relayout"] = str(e)
print(json.dumps(out))
"""


def test_logical_cpu_devices_and_strategies():
    out = run_isolated(CODE)
    assert out["devices"] == ["/cpu:0", "/cpu:1"] and out["shared"]
    assert "sharing the same" in out["describe"]
    assert out["auto"] == ["MirroredStrategy", 2] and out["mirrored"] == ["MirroredStrategy", 2]
    assert out["central-storage"] == ["CentralStorageStrategy", 2]
    assert out["auto_ops"] == "ReductionToOneDevice"  # measured faster than RING on CPUs
    assert out["single"] == "OneDeviceStrategy"
    assert "only be configured before TensorFlow starts" in out["relayout"]


HOST = """
import json, mirrorfit, tensorflow as tf
gpus = tf.config.list_physical_devices("GPU")
setup = mirrorfit.configure_devices()
strategy = mirrorfit.build_strategy(setup)
print(json.dumps({"gpus": len(gpus), "kind": setup.kind, "devices": list(setup.devices),
                  "shared": setup.shared_cores, "strategy": type(strategy).__name__,
                  "replicas": strategy.num_replicas_in_sync,
                  "logical": len(tf.config.list_logical_devices(setup.kind))}))
"""


def test_default_setup_is_what_tensorflow_reports():
    """No flags: every GPU TensorFlow lists, else the one CPU (on whatever host runs this)."""
    out = run_isolated(HOST)
    if out["gpus"]:
        assert out["kind"] == "GPU" and not out["shared"]
        assert out["devices"] == [f"/gpu:{i}" for i in range(out["gpus"])]
    else:
        assert out["kind"] == "CPU" and out["shared"] and out["devices"] == ["/cpu:0"]
    assert out["replicas"] == out["logical"] == len(out["devices"])
    assert out["strategy"] == ("OneDeviceStrategy" if out["replicas"] == 1 else "MirroredStrategy")


HOST_FEED = """
import os
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import json, mirrorfit, tensorflow as tf
from mirrorfit.engine.tensorflow.strategy import build_distribution
setup = mirrorfit.configure_devices(replicas=2)
out = {}
for kind in ("mirrored", "central-storage"):
    d = build_distribution(setup, kind=kind)
    out[kind] = d.feeds_from_host

d = build_distribution(setup, kind="mirrored")
rows = tf.data.Dataset.range(20).map(lambda i: (tf.fill([2], i), i * 10))

def make(worker, workers):
    return rows.batch(8)  # 8, 8, then a partial batch of 4

fed = d.distribute(make, per_replica=4)
out["plain"] = isinstance(fed, tf.data.Dataset)

@tf.function
def pieces(batch):
    return d.strategy.run(lambda x, y: (x[:, 0], y), args=d.split(batch))

got = []
for batch in fed:
    x, y = pieces(batch)
    got.append([[int(v) for v in t.numpy()] for t in d.strategy.experimental_local_results(x)])
    assert [list(t.numpy()) for t in d.strategy.experimental_local_results(y)] == \\
        [[10 * v for v in piece] for piece in got[-1]]
out["pieces"] = got
# TF's own distributed dataset cuts a full batch the same way
theirs = next(iter(d.strategy.experimental_distribute_dataset(rows.batch(8))))[0]
out["theirs"] = [[int(v) for v in t.numpy()[:, 0]]
                 for t in d.strategy.experimental_local_results(theirs)]
# a batch already cut per replica (a distributed iterator's) passes through split
whole = next(iter(d.strategy.experimental_distribute_dataset(rows.batch(8))))
x, _ = d.strategy.run(lambda x, y: (x, y), args=d.split(whole))
out["through"] = [int(t.shape[0]) for t in d.strategy.experimental_local_results(x)]
# sparse components: TF's distributed dataset cuts them
sparse = tf.data.Dataset.from_tensor_slices(tf.sparse.from_dense(tf.eye(8))).batch(4)
out["sparse_plain"] = isinstance(d.distribute(lambda w, n: sparse, per_replica=2),
                                 tf.data.Dataset)
print(json.dumps(out))
"""


def test_host_replicas_are_fed_plain_batches_cut_in_the_step():
    """Replicas on this host's CPUs take the plain dataset; the step cuts each batch into
    contiguous pieces, one per replica: every row exactly once, the same pieces as TF's
    distributed dataset for full batches, fewer rows (none twice) for a partial one."""
    out = run_isolated(HOST_FEED)
    assert out["mirrored"] is True and out["central-storage"] is False
    assert out["plain"]
    assert out["pieces"] == [
        [[0, 1, 2, 3], [4, 5, 6, 7]],
        [[8, 9, 10, 11], [12, 13, 14, 15]],
        [[16, 17], [18, 19]],
    ]
    assert out["theirs"] == out["pieces"][0]
    assert out["through"] == [4, 4]  # not cut again
    assert out["sparse_plain"] is False
