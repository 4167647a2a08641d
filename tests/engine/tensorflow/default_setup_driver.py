"""Run by tests/engine/tensorflow/test_strategy.py: ``python default_setup_driver.py``. The
device setup and strategy with no flags, on whatever host runs it. Prints one JSON line: the
GPUs TensorFlow lists, the setup's kind, devices and shared cores, the strategy's type and
replicas, and the logical devices of that kind."""

import json

import mirrorfit
import tensorflow as tf

gpus = tf.config.list_physical_devices("GPU")
setup = mirrorfit.configure_devices()
strategy = mirrorfit.build_strategy(setup)
print(
    json.dumps(
        {
            "gpus": len(gpus),
            "kind": setup.kind,
            "devices": list(setup.devices),
            "shared": setup.shared_cores,
            "strategy": type(strategy).__name__,
            "replicas": strategy.num_replicas_in_sync,
            "logical": len(tf.config.list_logical_devices(setup.kind)),
        }
    )
)
