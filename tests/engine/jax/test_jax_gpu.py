"""The JAX engine on a GPU (skipped where JAX sees none: CI and this project's CPU machines;
benchmarks/gpu_check.sh runs them where one is lent): the mesh is the GPUs, a bf16 run trains
and its state comes back to Keras, the feed keeps the device fed, and 1 GPU equals the CPU's
update to float rounding."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, _env, run_cli, run_isolated


def _gpus() -> int:
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; print(len(jax.devices('gpu')))"],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    return int(probe.stdout.strip() or 0) if probe.returncode == 0 else 0


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_gpus() == 0, reason="JAX sees no GPU here")]


def test_a_bf16_run_on_the_gpu_trains_and_keeps_the_device_fed(tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--model",
        "cnn",
        "--precision",
        "bf16",
        "--epochs",
        "2",
        "--global-batch-size",
        "256",
        "--no-progress",
        "--metrics-out",
        str(out),
        "--save-keras",
        str(tmp_path / "cnn.keras"),
        without_tensorflow=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["devices"][0].startswith("/gpu:") and summary["backend"] == "jax"
    assert summary["test_accuracy"] > 0.95
    assert summary["input_wait_share"] < 0.5  # the next block is on the device in time


STEP = """
import os, sys, json
sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
import numpy as np, jax
jax.config.update("jax_default_matmul_precision", "highest")  # not TF32: float32 on both
from mirrorfit.engine import jax as engine
from mirrorfit.engine.jax.devices import DeviceSetup
import keras, mirrorfit
data = mirrorfit.load_mnist(train_examples=1024, download=False)
out = {}
for where in ("gpu", "cpu"):
    setup = DeviceSetup(kind=where.upper(), devices=(f"/{where}:0",), physical=(where,),
                        shared_cores=False, engine="JAX", handles=tuple(jax.devices(where)[:1]))
    engine.seed(3)
    trainer = mirrorfit.Trainer(strategy=engine.build_distribution(setup),
                                model=mirrorfit.models.mlp, optimizer=keras.optimizers.SGD(0.05),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=128)
    trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128, seed=3),
                epochs=1)
    out[where] = [w.ravel().tolist() for w in trainer.model.get_weights()]
diff = max(float(np.abs(np.array(a) - np.array(b)).max()) for a, b in zip(out["gpu"], out["cpu"]))
print(json.dumps({"diff": diff}))
"""


def test_one_gpu_makes_the_cpus_update_to_float_rounding():
    assert run_isolated(STEP)["diff"] < 1e-4
