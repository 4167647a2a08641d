"""What `mirrorfit train` with a compiled --model says (job/fit_summary.py): the built-in
loop's --metrics-out fields, its epoch lines and its done line."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_a_compiled_models_summary_has_the_built_in_loops_fields(backend, tmp_path, mnist_dir):
    """On a3d3d7a a compiled --model's --metrics-out lacked 23 of the built-in loop's fields
    (steps, config, devices, final_train_loss, test_accuracy, ...), and --no-progress printed
    nothing per epoch."""
    common = ("--backend", backend, "--replicas", "2", "--data-dir", str(mnist_dir))
    common += ("--train-examples", "320", "--batch-size", "16", "--no-progress")
    built_in = run_cli(
        "train", "--model", "mlp", "--epochs", "1", *common,
        "--metrics-out", str(tmp_path / "b.json"),
    )  # fmt: skip
    assert built_in.returncode == 0, built_in.stderr[-3000:]
    d = tmp_path / "ckpt"
    first = run_cli(
        "train", "--model", "keras_models:digits", "--epochs", "1", *common,
        "--checkpoint-dir", str(d),
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = run_cli(
        "train", "--model", "keras_models:digits", "--epochs", "3", *common,
        "--checkpoint-dir", str(d), "--metrics-out", str(tmp_path / "c.json"),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    theirs = json.loads((tmp_path / "b.json").read_text())
    ours = json.loads((tmp_path / "c.json").read_text())
    assert set(theirs) - set(ours) == set()
    assert set(theirs["data"]) == set(ours["data"]) and ours["data"]["kind"] == "mnist"
    steps = 320 // 32  # global batch 2 x 16 (MNIST validates on its own 5,000)
    assert (ours["steps"], ours["steps_this_run"], ours["optimizer_updates"]) == (
        3 * steps,
        2 * steps,
        3 * steps,
    )
    assert ours["per_replica_batch_size"] == 16 and ours["replicas"] == 2
    assert ours["final_train_loss"] == ours["history"]["loss"][-1]
    assert ours["val_accuracy"] == ours["history"]["val_accuracy"][-1]
    assert ours["test_accuracy"] == ours["test"]["accuracy"] and ours["test_examples"] == 10000
    assert ours["learning_rate"] == pytest.approx(1e-3)  # its compile's Adam
    assert ours["config"]["epochs"] == 3 and ours["devices"] == theirs["devices"]
    lines = [ln for ln in resumed.stderr.splitlines() if ln.startswith("epoch ")]
    assert [ln.split(":")[0] for ln in lines] == ["epoch 2/3", "epoch 3/3"], resumed.stderr
    (done,) = [ln for ln in resumed.stderr.splitlines() if ln.startswith("done: ")]
    assert done.startswith(f"done: {3 * steps} steps ({2 * steps} in this run, resumed at step")
