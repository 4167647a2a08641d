"""cli: `mirrorfit train` end to end on the real MNIST, and every bad input as one clear line,
exit code 2, nothing written."""

import json

import pytest

from conftest import run_cli


def _one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [l for l in proc.stderr.splitlines() if l.startswith("mirrorfit: error:")
             or l.startswith("usage:") or "error:" in l]
    assert lines, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("args,needles", [
    (["--model", "resnet"], ["unknown model 'resnet'"]),
    (["--optimizer", "lion"], ["unknown optimizer 'lion'"]),
    (["--replicas", "2", "--global-batch-size", "33"], ["not divisible by 2 replicas"]),
    (["--replicas", "3", "--devices", "/cpu:0,/cpu:1"], ["asked for 3 replicas", "--replicas 2"]),
    (["--devices", "/gpu:7"], ["unknown device(s) /gpu:7"]),
    (["--strategy", "single", "--replicas", "2"], ["--strategy single", "--replicas 1"]),
    (["--cross-device-ops", "nccl", "--replicas", "2"], ["nccl needs GPUs"]),
    (["--epochs", "0"], ["epochs must be a positive integer"]),
    (["--epochs", "ten"], ["invalid int value: 'ten'"]),
    (["--data-dir", "/nonexistent"], ["no mnist.npz at --data-dir /nonexistent"]),
    (["--save-keras", "model.h5"], ["must end in .keras"]),
    (["--export-dir", "pyproject.toml"], ["is a file; give a folder"]),
])
def test_bad_input_is_one_clear_line(tmp_path, args, needles):
    out = tmp_path / "m.json"
    proc = run_cli("train", "--epochs", "1", "--train-examples", "256", "--no-progress",
                   "--metrics-out", str(out), *args)
    _one_line_error(proc, *needles)
    assert not out.exists()


def test_malformed_data_file(tmp_path):
    (tmp_path / "mnist.npz").write_bytes(b"garbage")
    proc = run_cli("train", "--data-dir", str(tmp_path), "--metrics-out", str(tmp_path / "m.json"))
    _one_line_error(proc, "is not a valid MNIST npz file")
    assert not (tmp_path / "m.json").exists()


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text("learning_rate = 0.1\n")
    _one_line_error(run_cli("train", "--config", str(cfg)), "unknown config key",
                    "'learning_rate'")


def test_metrics_out_folder_must_exist(tmp_path):
    proc = run_cli("train", "--metrics-out", str(tmp_path / "nope" / "m.json"))
    _one_line_error(proc, "does not exist; create it first")


def test_devices_lists_cpu_and_says_logical_split():
    proc = run_cli("devices")
    assert proc.returncode == 0
    assert "CPU" in proc.stdout and "--replicas N" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_chapter_mlp_reaches_95_percent(tmp_path, mnist_dir, replicas):
    """The chapter's recipe: MLP, 10 epochs, global batch 32, SGD 1e-2, on the real MNIST."""
    out = tmp_path / "metrics.json"
    proc = run_cli("train", "--data-dir", str(mnist_dir), "--replicas", str(replicas),
                   "--global-batch-size", "32", "--epochs", "10", "--optimizer", "sgd",
                   "--lr", "0.01", "--no-progress", "--metrics-out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{replicas} replica(s)" in proc.stderr
    if replicas > 1:
        assert "sharing the same" in proc.stderr  # says plainly they share the cores
    m = json.loads(out.read_text())
    assert m["replicas"] == replicas and m["global_batch_size"] == 32 and m["epochs"] == 10
    assert m["steps"] == 10 * (55000 // 32)
    assert m["test_accuracy"] >= 0.95 and m["val_accuracy"] >= 0.95
    assert m["train_examples_per_sec"] > 0 and m["wall_time_s"] > 0
    assert m["final_train_loss"] < 0.2


def test_config_file_and_flags(tmp_path, mnist_dir):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'data-dir = "{mnist_dir}"\nepochs = 3\ntrain-examples = 640\n'
                   "batch-size = 64\n")
    out = tmp_path / "m.json"
    proc = run_cli("train", "--config", str(cfg), "--epochs", "1", "--no-progress",
                   "--metrics-out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert m["epochs"] == 1 and m["steps"] == 10 and m["train_examples"] == 640
