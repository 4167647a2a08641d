"""Run by tests/engine/tensorflow/test_strategy.py: ``python cpu_strategies_driver.py``. With
GPUs hidden (CUDA_VISIBLE_DEVICES=""), splits the CPU into 2 logical devices and builds each
strategy on them, then on 1, then asks for 3 (refused: TensorFlow has started). Prints one
JSON line: the devices, each strategy's type and replicas, the auto strategy's cross-device
ops, and the refusal."""

import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""

import json  # noqa: E402

import mirrorfit  # noqa: E402
import tensorflow as tf  # noqa: E402

assert not tf.config.list_physical_devices("GPU")
setup = mirrorfit.configure_devices(replicas=2)
out = {"devices": list(setup.devices), "shared": setup.shared_cores, "describe": setup.describe()}
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
