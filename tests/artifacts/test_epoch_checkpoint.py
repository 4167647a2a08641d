"""mirrorfit.fit's checkpoints (artifacts/epoch_checkpoint.py) resumed as the run began: a
resume on another backend, at another precision or with another flag that fixes the run is
one line naming the way back, in the API's words and the CLI's."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cli, run_isolated

HERE = Path(__file__).parent


def test_the_api_refuses_a_resume_on_another_backend_or_precision(tmp_path):
    """fit(checkpoint_dir=) of a bf16 run on JAX, resumed at fp32 or on TensorFlow, went on
    without a word on 1c298fd (the layer-settings CRC leaves the dtype policy's name out)."""
    d = tmp_path / "ck"
    assert run_isolated(HERE / "engine_resume_driver.py", "jax", "bf16", 1, d)["refused"] is None
    at_fp32 = run_isolated(HERE / "engine_resume_driver.py", "jax", "fp32", 2, d)["refused"]
    assert at_fp32 == (
        f"{d}/epoch-000001 was trained with the dtype policy mixed_bfloat16; this model's is "
        "float32: resume with the precision it had (mirrorfit.setup(precision=), "
        "--precision), or give another checkpoint_dir to start over"
    )
    on_tf = run_isolated(HERE / "engine_resume_driver.py", "tensorflow", "bf16", 2, d)["refused"]
    assert on_tf == (
        f"{d}/epoch-000001 was written on the jax backend; this fit runs on tensorflow: resume "
        "on jax (backend='jax', --backend jax), or give another checkpoint_dir to start over"
    )
    assert run_isolated(HERE / "engine_resume_driver.py", "jax", "bf16", 2, d)["refused"] is None


def test_mirrorfit_train_names_the_changed_flag(tmp_path):
    """A compiled --model's run resumed with another --precision, --backend or --model: the
    earlier loop's line, naming the flag and its value (on 1c298fd the first two went on,
    exit 0)."""
    d = tmp_path / "ck"
    base = ["train", "--train-examples", "256", "--global-batch-size", "64", "--no-progress"]
    base += ["--checkpoint-dir", str(d)]
    first = ["--model", "keras_models:digits", "--backend", "jax", "--precision", "bf16"]
    assert run_cli(*base, *first, "--epochs", "1").returncode == 0
    changed = {
        ("--precision", "fp32"): ("--precision bf16", "--precision fp32"),
        ("--backend", "tensorflow"): ("--backend jax", "--backend tensorflow"),
        ("--model", "keras_models:digits_dropout"): (
            "--model keras_models:digits",
            "--model keras_models:digits_dropout",
        ),
    }
    for flags, (was, now) in changed.items():
        proc = run_cli(*base, *first, *flags, "--epochs", "2")  # the last flag wins
        assert proc.returncode == 2, (flags, proc.stderr[-3000:])
        assert proc.stderr.strip().splitlines()[-1] == (
            f"mirrorfit: error: checkpoint {d}/epoch-000001 was written with {was}, this run "
            f"has {now}: resume with {was}, or pass --fresh to start over"
        ), flags
    again = run_cli(*base, *first, "--epochs", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from" in again.stderr


def test_a_folder_of_the_earlier_loops_checkpoints_is_one_line_in_both_doors(tmp_path):
    """In mirrorfit train's words the line said --fresh twice ("pass --fresh (or give another
    --checkpoint-dir), or --fresh to set them aside") on 6cac313."""
    import keras
    import pytest

    from mirrorfit.artifacts import epoch_checkpoint
    from mirrorfit.errors import FitError
    from mirrorfit.job.keras_job import _flag_words

    (tmp_path / "ckpt-000000008").mkdir()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(FitError) as raised:
        epoch_checkpoint.restore_newest(model, tmp_path, None, writes=True)
    said = str(raised.value)
    assert said.endswith(
        "which this one does not resume; set them aside with fresh=True (--fresh) to start "
        "over, or use another checkpoint_dir"
    )
    assert _flag_words(said).endswith(
        "set them aside with --fresh to start over, or use another --checkpoint-dir"
    )
    assert (tmp_path / "ckpt-000000008").is_dir()  # nothing moved
