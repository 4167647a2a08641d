"""`mirrorfit evaluate --checkpoint-dir D --model pkg:fn` for a compiled model's checkpoints
(job/evaluate_compiled.py): the test split read as train gives it, without the train split."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import run_cli
from data_fixtures import folder_order, mnist, write_png_folder

pytestmark = pytest.mark.slow


def test_a_test_split_is_scored_without_a_train_split_of_a_global_batch(tmp_path):
    """An image folder of 90 training images (under evaluate's batch of 500), its test/ alone,
    and an .npz of x_test/y_test alone score the train run's test figures. On 917e7ef each
    was refused: the global batch 500 against 90 training examples, test/ without train/,
    and an .npz without x_train."""
    root, alone = tmp_path / "images", tmp_path / "alone"
    x, y = mnist(90)
    tx, ty = mnist(80, split="test")  # every class: test/ alone numbers them alike
    write_png_folder(root / "train", x, y)
    write_png_folder(root / "test", tx, ty)
    shutil.copytree(root / "test", alone / "test")
    d, model = tmp_path / "ckpt", "keras_models:digits_for_the_data"
    trained = run_cli(
        *("train", "--backend", "tensorflow", "--model", model, "--data", str(root)),
        *("--batch-size", "15", "--epochs", "1", "--checkpoint-dir", str(d), "--no-progress"),
        *("--metrics-out", str(tmp_path / "m.json")),
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    test = json.loads((tmp_path / "m.json").read_text())["test"]
    order = folder_order(ty)  # the folder's order: by class, then name
    classes = np.unique(y)
    np.savez(
        tmp_path / "test.npz",
        x_test=tx[order][..., None],
        y_test=np.searchsorted(classes, ty[order]),
    )
    for data in (root, alone, tmp_path / "test.npz"):
        out = tmp_path / f"{data.name}.json"
        scored = run_cli(
            *("evaluate", "--checkpoint-dir", str(d), "--model", model, "--data", str(data)),
            *("--metrics-out", str(out)),
        )
        assert scored.returncode == 0, (data, scored.stderr[-3000:])
        figures = json.loads(out.read_text())
        assert figures["examples"] == 80
        assert figures["test_accuracy"] == pytest.approx(test["accuracy"], abs=1e-6), data
        assert figures["test_loss"] == pytest.approx(test["loss"], rel=1e-5), data
