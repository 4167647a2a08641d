"""Run by tests/engine/jax/test_jax_gpu.py where JAX sees a GPU: ``python
gpu_against_cpu_driver.py``. The JAX engine (TensorFlow blocked) trains the MLP one epoch on
1,024 MNIST examples on GPU 0 and on the CPU, from the same seed, at full float32 matmul
precision (not TF32). Prints one JSON line: the largest difference between the two runs'
weights."""

import json
import os
import sys

sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")  # not TF32: float32 on both

from mirrorfit.engine import jax as engine  # noqa: E402
from mirrorfit.engine.jax.devices import DeviceSetup  # noqa: E402

import keras  # noqa: E402
import mirrorfit  # noqa: E402

data = mirrorfit.load_mnist(train_examples=1024, download=False)
out = {}
for where in ("gpu", "cpu"):
    setup = DeviceSetup(
        kind=where.upper(),
        devices=(f"/{where}:0",),
        physical=(where,),
        shared_cores=False,
        engine="JAX",
        handles=tuple(jax.devices(where)[:1]),
    )
    engine.seed(3)
    trainer = mirrorfit.Trainer(
        strategy=engine.build_distribution(setup),
        model=mirrorfit.models.mlp,
        optimizer=keras.optimizers.SGD(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=128,
    )
    trainer.fit(
        mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128, seed=3), epochs=1
    )
    out[where] = [w.ravel().tolist() for w in trainer.model.get_weights()]
diff = max(float(np.abs(np.array(a) - np.array(b)).max()) for a, b in zip(out["gpu"], out["cpu"]))
print(json.dumps({"diff": diff}))
