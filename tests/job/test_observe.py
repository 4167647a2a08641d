"""observe: TensorBoard scalars, CPU utilisation sampling, the out-of-memory hint."""

import time
from pathlib import Path

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import mirrorfit
from conftest import run_cli
from mirrorfit.job.observe import CpuGpuSampler, out_of_memory_hint

HERE = Path(__file__).parent


def test_scalar_writer_records_training_and_epoch_scalars(tmp_path):
    """`mirrorfit train --logdir` on TensorFlow: 40 steps, 5 a call."""
    args = ["--model", "mlp", "--train-examples", "2560", "--global-batch-size", "64"]
    args += ["--epochs", "1", "--steps-per-execution", "5", "--lr", "0.05", "--no-progress"]
    proc = run_cli("train", *args, "--logdir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {
        "train/loss",
        "train/accuracy",
        "train/learning_rate",
        "train/examples_per_sec",
        "epoch/val_accuracy",
        "epoch/examples_per_sec",
    } <= tags
    loss_steps = [e.step for e in events.Tensors("train/loss")]
    assert loss_steps == list(range(5, 41, 5))  # one point per execution of 5 steps
    lr = [float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("train/learning_rate")]
    assert lr == pytest.approx([0.05] * 8)
    rates = [
        float(tf.make_ndarray(e.tensor_proto)) for e in events.Tensors("train/examples_per_sec")
    ]
    assert len(rates) == 7 and min(rates) > 0  # none from the first (compiling) execution


def _nvml_gpus() -> int:
    """NVIDIA GPUs as NVML (the sampler's source) reports them; 0 without driver or GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def test_cpu_sampler_sees_a_busy_core():
    with CpuGpuSampler(interval_s=0.05) as sampler:
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
    summary = sampler.summary()
    assert len(sampler.cpu) >= 3 and summary["cpu_percent"] > 0
    if _nvml_gpus():  # one GPU reading (mean over the GPUs) per CPU reading
        assert len(sampler.gpu) == len(sampler.cpu) and 0 <= summary["gpu_percent"] <= 100
    else:
        assert sampler.gpu == [] and summary["gpu_percent"] is None


def test_out_of_memory_says_what_to_try():
    with pytest.raises(mirrorfit.MirrorfitError) as info:
        with out_of_memory_hint(256):
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
    message = str(info.value)
    assert "out of memory at a batch of 256 per replica" in message
    for flag in ("--accum-steps", "--remat", "--precision", "--gpu-memory-limit"):
        assert flag in message


def test_out_of_memory_on_jax_says_what_to_try():
    """JAX's own error (JaxRuntimeError since JAX 0.5; the hint once looked for the name
    XlaRuntimeError only, and a JAX run's out-of-memory error was a traceback)."""
    import jax.numpy as jnp

    with pytest.raises(mirrorfit.MirrorfitError, match="out of memory at a batch of 8 per"):
        with out_of_memory_hint(8):
            jnp.zeros((1 << 42,), "float32").block_until_ready()  # 16 TiB
