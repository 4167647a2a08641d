"""Run by tests/engine/jax/test_jax_gpu.py where JAX sees a GPU: ``python
gpu_against_cpu_driver.py``. ``mirrorfit.fit`` (TensorFlow blocked) trains the MLP one epoch on
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
from mirrorfit.fitting.setup import Setup, use  # noqa: E402

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
    use(Setup(backend="jax", devices=setup, placement=engine.build_distribution(setup)))
    engine.seed(3)
    model = mirrorfit.models.mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    x = data.x_train.astype("float32") / 255
    mirrorfit.fit(model, x, data.y_train, batch_size=128, epochs=1, shuffle=False, verbose=0)
    out[where] = [w.ravel().tolist() for w in model.get_weights()]
diff = max(float(np.abs(np.array(a) - np.array(b)).max()) for a, b in zip(out["gpu"], out["cpu"]))
print(json.dumps({"diff": diff}))
