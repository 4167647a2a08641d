"""devices + strategy: logical CPU splits, strategy choice by name, clear errors."""

from conftest import run_isolated

CODE = """
import json, mirrorfit, tensorflow as tf
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
