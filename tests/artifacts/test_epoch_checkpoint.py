"""mirrorfit.fit's checkpoints (artifacts/epoch_checkpoint.py) resumed as the run began: a
resume on another backend or at another precision is one line naming the way back."""

from __future__ import annotations

from conftest import run_cli


def test_a_resume_on_another_backend_or_precision_is_one_line(tmp_path):
    """A compiled model's run (bf16 on JAX) resumed at fp32, or on TensorFlow, went on
    without a word on 1c298fd (exit 0); the earlier loop refused both by name."""
    d = tmp_path / "ck"
    base = ["train", "--model", "keras_models:digits", "--train-examples", "256"]
    base += ["--global-batch-size", "64", "--no-progress", "--checkpoint-dir", str(d)]
    jax_bf16 = ["--backend", "jax", "--precision", "bf16"]
    first = run_cli(*base, *jax_bf16, "--epochs", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    refused = {
        ("--backend", "jax", "--precision", "fp32"): (
            f"{d}/epoch-000001 was trained with the dtype policy mixed_bfloat16; this "
            "model's is float32: resume with the precision it had (mirrorfit.setup("
            "precision=), --precision), or give another checkpoint_dir to start over"
        ),
        ("--backend", "tensorflow", "--precision", "bf16"): (
            f"{d}/epoch-000001 was written on the jax backend; this fit runs on tensorflow: "
            "resume on jax (backend='jax', --backend jax), or give another checkpoint_dir "
            "to start over"
        ),
    }
    for flags, line in refused.items():
        proc = run_cli(*base, *flags, "--epochs", "2")
        assert proc.returncode == 2, (flags, proc.stderr[-3000:])
        assert proc.stderr.strip().splitlines()[-1] == f"mirrorfit: error: {line}", flags
    again = run_cli(*base, *jax_bf16, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr
