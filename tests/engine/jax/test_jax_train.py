"""The JAX engine through `mirrorfit train --backend jax`: it trains without TensorFlow, pads no
more than the epoch, resumes after SIGTERM to the predictions of an uninterrupted run, and
refuses a TensorFlow checkpoint by name.
"""

import json
from pathlib import Path

import pytest

from conftest import run_cli, run_isolated

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent


def test_train_on_jax_imports_no_tensorflow(tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--epochs",
        "2",
        "--train-examples",
        "2048",
        "--no-progress",
        "--metrics-out",
        str(out),
        without_tensorflow=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["backend"] == "jax" and summary["steps"] == 2 * (2048 // 32)
    assert summary["test_accuracy"] > 0.5 and summary["test_examples"] == 10000  # it learnt
    assert "XLA: on" in proc.stderr


def test_steps_per_execution_beyond_the_epoch_pads_no_more_than_the_epoch(tmp_path):
    # A block of S=10**9 batches of MNIST would be 22 TiB of padding: one epoch is 8 steps.
    out = tmp_path / "m.json"
    proc = run_cli(
        "train",
        "--backend",
        "jax",
        "--epochs",
        "1",
        "--train-examples",
        "256",
        "--steps-per-execution",
        "1000000000",
        "--no-progress",
        "--metrics-out",
        str(out),
        without_tensorflow=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["steps"] == 8


# Dropout (its RNG state must be checkpointed) and Adam (its slots)
RUN = [
    "train",
    "--backend",
    "jax",
    "--model",
    "user_models:tiny_dropout",
    "--train-examples",
    "512",
    "--epochs",
    "3",
    "--global-batch-size",
    "32",
    "--steps-per-execution",
    "2",
    "--checkpoint-every",
    "8",
    "--optimizer",
    "adam",
    "--lr",
    "0.003",
    "--no-progress",
]


def test_sigterm_mid_epoch_then_resume_predicts_as_an_uninterrupted_run(tmp_path):
    a = [*RUN, "--checkpoint-dir", str(tmp_path / "a"), "--save-keras", str(tmp_path / "a.keras")]
    b = [*RUN, "--checkpoint-dir", str(tmp_path / "b"), "--save-keras", str(tmp_path / "b.keras")]
    # One interpreter runs all three; run 1 gets SIGTERM after step 22.
    runs, armed = json.dumps([a, b, b]), json.dumps({1: 22})
    ref, stopped, resumed = run_isolated(HERE / "sigterm_runs_driver.py", runs, armed)
    assert ref["code"] == 0, ref["err"][-3000:]
    assert stopped["code"] == 75, stopped["err"][-3000:]  # epoch 2, step 22 of 48: mid-epoch
    assert "epoch-000001-step-000006 at epoch 2, step 6" in stopped["err"]
    assert resumed["code"] == 0, resumed["err"][-3000:]
    assert "(epoch 2, step 6)" in resumed["err"]
    meta = json.loads((tmp_path / "b" / "epoch-000003" / "meta.json").read_text())
    assert meta["backend"] == "jax"
    out = run_isolated(HERE / "predict_driver.py", tmp_path / "a.keras", tmp_path / "b.keras")
    assert out["spread"] > 0.01 and out["max_diff"] < 1e-6


def test_a_tensorflow_checkpoint_is_not_resumed_on_jax(tmp_path):
    common = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--epochs",
        "1",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "c"),
    ]
    assert run_cli(*common).returncode == 0
    proc = run_cli(
        *common[:-2],
        "--epochs",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "c"),
        "--backend",
        "jax",
        without_tensorflow=True,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("mirrorfit: error")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "written with --backend tensorflow, this run has --backend jax" in lines[0]
