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
    assert out["strategy"] == ("OneDeviceStrategy" if out["replicas"] == 1
                               else "MirroredStrategy")
