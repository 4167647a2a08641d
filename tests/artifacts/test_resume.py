"""Resuming with changed settings and checkpoint names (issue 10's review): a rerun resumes
exactly or refuses in one line naming the flag, its original value and --fresh; a healthy
checkpoint is never called corrupt."""

import json

import pytest

from test_checkpoint import _drive

pytestmark = pytest.mark.slow


def test_changed_settings_are_refused_by_name_before_the_state_is_read(tmp_path):
    base = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "c"),
    ]
    refused = {  # flags of the rerun -> what the one line must say
        # Keras restored its learning-rate variable: "0.5" was printed, 0.01 was used.
        ("--lr", "0.5"): "written with --lr 0.01, this run has --lr 0.5: resume with --lr 0.01",
        # TensorFlow's "Found 1 Python objects that were not bound", reported as corruption.
        ("--warmup-epochs", "0"): "written with --warmup-epochs 1.0, this run has "
        "--warmup-epochs 0.0: resume with --warmup-epochs 1.0",
        ("--precision", "fp16"): "written with --precision fp32, this run has --precision fp16",
        ("--optimizer", "adam"): "written with --optimizer sgd, this run has --optimizer adam",
        ("--lr-scaling", "linear", "--base-batch", "16"): "written with --lr-scaling none, this "
        "run has --lr-scaling linear",
        ("--model", "user_models:tiny_dropout"): "written with --model user_models:tiny, this "
        "run has --model user_models:tiny_dropout",
    }
    same = ["--lr", "0.01", "--warmup-epochs", "1"]
    runs = [[*base, *same, "--epochs", "1"]]
    runs += [[*base, *same, "--epochs", "2", *flags] for flags in refused]  # the last flag wins
    # What may change: the run's length and how steps are executed. Resumes.
    runs.append(
        [
            *base,
            *same,
            "--epochs",
            "2",
            "--steps-per-execution",
            "3",
            "--metrics-out",
            str(tmp_path / "m.json"),
        ]
    )
    first_run, *results, resumed = _drive(runs, {}, {})
    assert first_run["code"] == 0, first_run["err"][-3000:]
    for (flags, expected), got in zip(refused.items(), results):
        lines = [ln for ln in got["err"].splitlines() if ln.startswith("mirrorfit: error")]
        assert got["code"] == 2 and len(lines) == 1, (flags, got["err"][-3000:])
        assert expected in lines[0] and "--fresh" in lines[0], (flags, lines[0])
        assert "cannot be read" not in lines[0]
    assert resumed["code"] == 0, resumed["err"][-3000:]
    assert "resuming from" in resumed["err"] and "(epoch 2, step 0)" in resumed["err"]
    assert json.loads((tmp_path / "m.json").read_text())["learning_rate"] == pytest.approx(0.01)
    assert sorted(p.name for p in (tmp_path / "c").glob("epoch-*")) == [
        "epoch-000001",
        "epoch-000002",
    ]


def test_names_are_unique_and_checkpoint_names_ascii(tmp_path):
    from mirrorfit.artifacts.checkpoint_meta import discard, fit_checkpoints

    asides = []
    for _ in range(3):  # --fresh three times within a second used to raise FileExistsError
        (tmp_path / "epoch-000001").mkdir()
        (tmp_path / "epoch-000001" / "meta.json").write_text("{}")
        asides.append(discard(tmp_path, fit_checkpoints(tmp_path)))
    assert len(set(asides)) == 3 and all((a / "epoch-000001").is_dir() for a in asides)
    for name in ("epoch-٣٣٣٣٣٣", "epoch-000005\n", "epoch-000007"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text("{}")
    assert [p.name for p in fit_checkpoints(tmp_path)] == ["epoch-000007"]
