"""The JAX engine on a GPU (skipped where JAX sees none: CI and this project's CPU machines;
benchmarks/gpu_check.sh runs them where one is lent): the mesh is the GPUs, a bf16 run trains
and its state comes back to Keras, the feed keeps the device fed, and 1 GPU equals the CPU's
update to float rounding."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, _env, run_cli, run_isolated

HERE = Path(__file__).parent


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


def test_one_gpu_makes_the_cpus_update_to_float_rounding():
    assert run_isolated(HERE / "gpu_against_cpu_driver.py")["diff"] < 1e-4
