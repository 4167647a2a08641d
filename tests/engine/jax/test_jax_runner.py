"""engine.jax.runner (through `mirrorfit train --backend jax`): it trains without TensorFlow,
resumes after SIGTERM to the predictions of an uninterrupted run, reads the examples in the
order the TensorFlow engine reads them, and counts every evaluation example once.
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


def test_the_feed_reads_the_examples_the_tensorflow_pipeline_reads_in_its_order():
    out = run_isolated(HERE / "feed_order_driver.py")
    assert out["n"] == [17, 17]  # epoch 1 of 20 steps, less the 3 already trained
    assert out["x"] < 1e-6 and out["y"]


def test_evaluation_counts_each_example_once_over_two_devices():
    out = run_isolated(HERE / "uneven_eval_driver.py")
    # 15 batches of 63 (each padded to 64 for 2 devices) and one of 56
    assert out["result"]["examples"] == 1001
    assert out["result"]["accuracy"] == pytest.approx(out["acc"], abs=1e-6)
    assert out["result"]["loss"] == pytest.approx(out["loss"], rel=1e-4)


def test_evaluation_blocks_are_sized_by_bytes_and_hold_every_example_once():
    """A block of batches is allocated whole (host and devices): 32 batches of 1,024 images of
    64x64x3 floats were 1.6 GB for 200 validation examples. Blocks stay under 64 MiB of inputs
    (at least one batch), and every example is counted once with weight 1."""
    import numpy as np

    from mirrorfit.engine.jax.runner import EVAL_BLOCK, EVAL_BLOCK_BYTES, _eval_blocks

    big = (np.ones((200, 64, 64, 3), np.float32), np.arange(200) % 10)
    blocks = list(_eval_blocks(big, batch=1024, padded=1024))
    assert len(blocks) == 1
    xs, ys, ws, count, real = blocks[0]
    assert xs.shape == (1, 1024, 64, 64, 3) and count == 1 and real == 200
    assert ws.sum() == 200 and ys[0, :200].tolist() == big[1].tolist()

    small = (np.arange(1000 * 4, dtype=np.uint8).reshape(1000, 2, 2), np.arange(1000) % 10)
    blocks = list(_eval_blocks(small, batch=7, padded=8))
    assert {b[0].shape[0] for b in blocks} == {EVAL_BLOCK}  # one compiled shape
    assert sum(b[4] for b in blocks) == 1000 and sum(b[2].sum() for b in blocks) == 1000
    seen = np.concatenate([xs[i, :8][ws[i] > 0] for xs, _, ws, n, _ in blocks for i in range(n)])
    assert seen.tolist() == small[0].tolist()

    mid = (np.zeros((50, 1024, 1024), np.uint8), np.zeros(50, np.int64))  # 1 MiB an example
    xs = next(_eval_blocks(mid, batch=8, padded=8))[0]
    assert xs.shape[0] == EVAL_BLOCK_BYTES // (8 << 20) and xs.nbytes <= EVAL_BLOCK_BYTES


def test_an_evaluation_batch_larger_than_the_data_is_the_data():
    """--eval-batch-size 1000000 on 10,000 validation examples allocated a block of a million
    padded examples (4.7 GB peak, against 0.56 GB at 10,000)."""
    import numpy as np

    from mirrorfit.engine.jax.runner import _eval_batch

    val = (np.zeros((10_000, 28, 28), np.uint8), np.zeros(10_000, np.int32))
    assert _eval_batch(val, 1_000_000, 2) == (10_000, 10_000)
    assert _eval_batch(val, 999, 2) == (999, 1000)  # padded to a multiple of the replicas
    assert _eval_batch((val[0][:3], val[1][:3]), 64, 4) == (3, 4)
