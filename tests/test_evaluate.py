"""`mirrorfit evaluate --data SOURCE`: a checkpoint or a SavedModel scored on a source's test
split (what its training run reported); a source without one, or whose examples or classes the
model cannot take, is one line and exit code 2."""

import numpy as np
import pytest

from conftest import run_isolated
from data_fixtures import mnist, write_png_folder
from mirrorfit.cli import main


@pytest.mark.parametrize("args, needle", [
    (["--data", "synthetic"], "--data synthetic has no test split to evaluate on"),
    (["--data", "{tmp}/*.tfrecord"], "TFRecord sources are training examples only"),
    (["--data", "{tmp}/missing.npz"], "--data {tmp}/missing.npz: no such file"),
    (["--image-size", "32,32"], "--image-size resizes images read from files"),
    (["--data", "{tmp}", "--data-dir", "{tmp}"], "--data-dir says where MNIST is"),
    (["--data", "{tmp}", "--image-size", "28"], "--image-size 28: expected 2 positive"),
])
def test_bad_evaluate_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    (tmp_path / "a.tfrecord").write_bytes(b"")
    code = main(["evaluate", "--checkpoint-dir", str(tmp_path / "ckpt"),
                 *[a.replace("{tmp}", str(tmp_path)) for a in args]])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("mirrorfit: error:") and \
        needle.replace("{tmp}", str(tmp_path)) in lines[0], lines


def test_exactly_one_model_is_evaluated(capsys):
    assert main(["evaluate"]) == 2
    assert "pass exactly one of --checkpoint-dir or --saved-model" in capsys.readouterr().err


@pytest.mark.slow
def test_checkpoint_and_saved_model_score_a_folders_test_split_as_training_did(tmp_path):
    """One interpreter trains on an image folder (train/ and test/), then evaluates the
    checkpoint and the exported SavedModel (raw uint8 signature) on it, and refuses sources
    the model cannot take."""
    x, y = mnist(640)
    write_png_folder(tmp_path / "imgs" / "train", x, y)
    write_png_folder(tmp_path / "imgs" / "test", *mnist(200, split="test"))
    np.savez(tmp_path / "no_test.npz", x_train=x, y_train=y)
    three = y < 3  # a folder of 3 class folders: its labels 0-2 mean other classes
    write_png_folder(tmp_path / "three" / "train", x[three][:30], y[three][:30])
    write_png_folder(tmp_path / "three" / "test", x[three][30:60], y[three][30:60])
    imgs, ckpt, models = tmp_path / "imgs", tmp_path / "ckpt", tmp_path / "models" / "m"
    runs = {
        "train": ["train", "--data", str(imgs), "--epochs", "1", "--global-batch-size", "32",
                  "--checkpoint-dir", str(ckpt), "--export-dir", str(models),
                  "--export-preprocessing", "--metrics-out", str(tmp_path / "train.json"),
                  "--no-progress"],
        "checkpoint": ["evaluate", "--checkpoint-dir", str(ckpt), "--data", str(imgs),
                       "--metrics-out", str(tmp_path / "ckpt.json")],
        "saved_model": ["evaluate", "--saved-model", str(models), "--data", str(imgs),
                        "--metrics-out", str(tmp_path / "saved.json")],
        "mnist": ["evaluate", "--checkpoint-dir", str(ckpt)],
        "resized": ["evaluate", "--checkpoint-dir", str(ckpt), "--data", str(imgs),
                    "--image-size", "32,32"],
        "no_test": ["evaluate", "--saved-model", str(models), "--data",
                    str(tmp_path / "no_test.npz")],
        "classes": ["evaluate", "--checkpoint-dir", str(ckpt), "--data",
                    str(tmp_path / "three")],
    }
    out = run_isolated(f"""
        import contextlib, io, json, pathlib
        from mirrorfit.cli import main
        results = {{}}
        for name, args in {runs!r}.items():
            err, std = io.StringIO(), io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
                rc = main(args)
            results[name] = [rc, err.getvalue(), std.getvalue()]
        for name in ("train", "ckpt", "saved"):
            path = pathlib.Path({str(tmp_path)!r}) / f"{{name}}.json"
            results[name + ".json"] = json.loads(path.read_text()) if path.exists() else None
        print(json.dumps(results))
    """, timeout=600)
    assert out["train"][0] == 0, out["train"][1][-2000:]
    trained = out["train.json"]
    for name in ("checkpoint", "saved_model"):
        assert out[name][0] == 0, out[name][1][-2000:]
        result = out[{"checkpoint": "ckpt.json", "saved_model": "saved.json"}[name]]
        assert result["examples"] == 200 == trained["test_examples"]
        assert result["test_accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-4)
        assert result["test_loss"] == pytest.approx(trained["test_loss"], rel=1e-3)
        assert result["data"].startswith("image folder") and f"of --data {imgs}" in out[name][2]
    for name, needle in (
            ("mnist", "--data mnist gives examples of shape 28x28 but the model of "
                      f"{ckpt} (step 20) takes 28x28x1"),
            ("resized", "gives examples of shape 32x32x1 but the model of"),
            ("no_test", "has no test split to evaluate on: the file has no x_test/y_test"),
            ("classes", "has 3 classes but the model of")):
        rc, err, _ = out[name]
        errors = [ln for ln in err.splitlines() if ln.startswith("mirrorfit: error:")]
        assert rc == 2 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
        assert needle in errors[0], errors[0]
