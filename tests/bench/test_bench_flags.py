"""`mirrorfit bench --data/--model/--input-shape/--num-classes` and the file-source flags
(`--image-size`, `--image-feature`, `--label-feature`, `--cache`, `--validation-split`): bad
values are one line and exit code 2 before any process starts (in this process: the check is
plain Python, and TensorFlow is not loaded for it); good ones reach every point."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mirrorfit.bench
from conftest import ROOT, fresh_env
from data_fixtures import mnist, write_png_folder
from mirrorfit.cli import main
from mirrorfit.config import MAX_IMAGE_SIDE

HERE = Path(__file__).parent


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["--model", "resnet50"],
            "unknown model 'resnet50' (did you mean 'ResNet50'?); use mlp, cnn",
        ),
        (["--model", "ResNet50"], "use --data synthetic --input-shape 32,32,3"),
        (
            ["--model", "ResNet50", "--data", "synthetic", "--input-shape", "16,16,3"],
            "--input-shape 16,16,3: --model ResNet50 needs images of at least 32x32 pixels",
        ),
        (
            ["--model", "InceptionV3", "--data", "synthetic", "--input-shape", "224,224"],
            "height,width,channels",
        ),
        (["--data", "synthetic", "--num-classes", "0"], "--num-classes must be 2 or more"),
        (
            ["--data", "synthetic", "--num-classes", "99999999999"],
            "--num-classes 99999999999: at most 1,000,000",
        ),
        (["--data", "cifar10"], "--data cifar10: no such file or folder; use mnist, synthetic"),
        (["--image-size", "32,32"], "--image-size resizes images read from files"),
        (["--cache", "memory"], "--data mnist is already in memory: drop --cache"),
        (["--validation-split", "0.1"], "--data mnist has its own validation split"),
        (["--label-feature", "y"], "--label-feature names a TFRecord feature"),
    ],
)
def test_bad_bench_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    code = main(["bench", "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mirrorfit: error:"), err
    assert needle in lines[0], err
    assert not (tmp_path / "out").exists()


def test_input_shape_must_be_integers(capsys):
    with pytest.raises(SystemExit) as info:  # argparse: usage line and exit code 2
        main(["bench", "--data", "synthetic", "--input-shape", "a,b,3"])
    assert info.value.code == 2
    assert (
        "--input-shape 'a,b,3': expected a comma-separated list of int" in capsys.readouterr().err
    )


def test_file_source_flags_reach_every_point(tmp_path, monkeypatch):
    x, y = mnist(40)
    write_png_folder(tmp_path / "imgs", x, y)
    seen = []
    monkeypatch.setattr(mirrorfit.bench, "run_bench", lambda grid, **kw: seen.append(grid))
    code = main(
        [
            "bench",
            "--data",
            str(tmp_path / "imgs"),
            "--image-size",
            "32,32",
            "--cache",
            str(tmp_path / "cache"),
            "--validation-split",
            "0.2",
            "--replicas",
            "1,2",
            "--precision",
            "fp32",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 0 and len(seen) == 1
    points = seen[0].points()
    assert len(points) == 4
    assert {(p.data, p.image_size, p.cache, p.validation_split) for p in points} == {
        (str(tmp_path / "imgs"), (32, 32), str(tmp_path / "cache"), 0.2)
    }


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--data", "{tmp}/imgs", "--image-size", "28"], "--image-size 28: expected 2 positive"),
        (
            ["--data", "{tmp}/imgs", "--image-size", f"{MAX_IMAGE_SIDE + 1},32"],
            f"--image-size {MAX_IMAGE_SIDE + 1},32: at most {MAX_IMAGE_SIDE} pixels a side",
        ),
        (["--data", "{tmp}/d.npz", "--cache", "memory"], "is already in memory: drop --cache"),
        (["--data", "{tmp}/imgs", "--data-dir", "{tmp}"], "--data-dir says where MNIST is"),
    ],
)
def test_bad_file_source_flags_are_one_line_exit_2(tmp_path, capsys, args, needle):
    x, y = mnist(20)
    write_png_folder(tmp_path / "imgs", x, y)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y)
    code = main(
        [
            "bench",
            "--out",
            str(tmp_path / "out"),
            *[a.replace("{tmp}", str(tmp_path)) for a in args],
        ]
    )
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
    assert not (tmp_path / "out").exists()


def test_flag_checks_and_help_come_before_tensorflow_loads(tmp_path):
    """Loading TensorFlow takes seconds: a bad flag must cost none of them. In a fresh
    interpreter, since this one has TensorFlow loaded already."""
    (tmp_path / "imgs").mkdir()
    out = ["--out", str(tmp_path / "out")]
    bad = [
        (["--precision", "fp64"], "unknown precision 'fp64' in --precision"),
        (["--textbook-precision", "fp8"], "unknown precision 'fp8' in --textbook-precision"),
        (["--replicas", "0"], "--replicas needs positive integers"),
        (["--tolerance", "nan"], "--tolerance must be a finite accuracy difference"),
        (["--model", "resnet50"], "unknown model 'resnet50'"),
        (["--epochs", "1"], "bench needs --epochs 2 or more"),
        (
            ["--data", str(tmp_path / "imgs"), "--image-size", "1048576,1048576"],
            f"--image-size 1048576,1048576: at most {MAX_IMAGE_SIDE} pixels a side",
        ),
    ]
    argvs = [["bench", "--help"]] + [["bench", *args, *out] for args, _ in bad]
    proc = subprocess.run(
        [sys.executable, str(HERE / "fresh_cli_driver.py"), json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env=fresh_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    help_run, *runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert help_run["code"] == 0 and "usage: mirrorfit bench" in help_run["out"]
    assert help_run["loaded"] == [], help_run
    for (args, needle), run in zip(bad, runs):
        lines = [ln for ln in run["err"].splitlines() if ln.strip()]
        assert run["code"] == 2 and len(lines) == 1 and needle in lines[0], run
        assert run["loaded"] == [], f"{args}: {run['loaded']} loaded before the flag check"
    assert not (tmp_path / "out").exists()


def test_bench_rows_of_tensorflow_without_it_are_one_line_before_anything_runs(tmp_path):
    from conftest import run_cli

    proc = run_cli(
        "bench",
        "--backend",
        "jax,tensorflow",
        "--out",
        str(tmp_path / "out"),
        without_tensorflow=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mirrorfit: error: bench --backend tensorflow needs TensorFlow, which is not "
        "installed: pip install 'mirrorfit[tensorflow]', or bench --backend jax alone"
    ), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_bench_runs_jax_rows_without_tensorflow(tmp_path):
    """`bench --backend jax` on MNIST: the JAX engine and Keras's own fit on JAX, each point in
    its own process, the matmul peak and FLOPs measured by XLA, nothing of TensorFlow."""
    import json

    from conftest import run_cli

    proc = run_cli(
        "bench",
        "--backend",
        "jax",
        "--replicas",
        "1",
        "--precision",
        "fp32",
        "--repeats",
        "1",
        "--epochs",
        "2",
        "--train-examples",
        "1280",
        "--out",
        str(tmp_path / "out"),
        without_tensorflow=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {
        r["label"]: r for r in json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    }
    assert set(rows) == {"jax x1 fp32 spe50", "jax keras fit x1"}
    mine = rows["jax x1 fp32 spe50"]
    assert mine["backend"] == "jax" and mine["examples_per_sec"] > 0
    assert 0 < mine["mfu"] < 1 and mine["test_accuracy"] > 0.3
    assert mine["vs_textbook"] > 0


@pytest.mark.slow
# JAX on one device: Keras's own fit under DataParallel over 2 logical CPUs (the yardstick)
# aborts now and then in a collective's rendezvous on 2 cores ("only 1 of them arrived").
@pytest.mark.parametrize("backend, replicas", [("jax", "1"), ("tensorflow", "2")])
def test_bench_trains_a_compiled_model_as_compiled_on_both_sides(backend, replicas, tmp_path):
    """`bench --model pkg:fn` with a compiled model (Adam, its own Rescaling of uint8 pixels):
    mirrorfit's rows go through mirrorfit.fit and the yardstick through the model's own fit,
    both as compiled, so both reach the same test accuracy. Before, mirrorfit's rows trained
    it with SGD 0.01 on pixels scaled to [0, 1] as the built-in models take them."""
    import json

    from conftest import run_cli

    proc = run_cli(
        "bench",
        "--backend",
        backend,
        "--model",
        "keras_models:chapter_cnn",
        "--replicas",
        replicas,
        "--precision",
        "fp32",
        "--repeats",
        "1",
        "--epochs",
        "2",
        "--train-examples",
        "1024",
        "--global-batch-size",
        "64",
        "--out",
        str(tmp_path / "out"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "is compiled: every point trains it as compiled" in proc.stderr
    rows = json.loads((tmp_path / "out" / "bench.json").read_text())["rows"]
    ours = next(r for r in rows if r["kind"] == "mirrorfit")
    theirs = next(r for r in rows if r["kind"] == "textbook")
    assert ours["examples_per_sec"] > 0 and theirs["examples_per_sec"] > 0
    # the same seeded model, optimizer and batches (mirrorfit shuffles as Keras does, not the
    # same order), 2 epochs of Adam: within a few points of each other, and far above the
    # 0.1 of chance
    assert ours["test_accuracy"] > 0.5 and theirs["test_accuracy"] > 0.5
    assert abs(ours["test_accuracy"] - theirs["test_accuracy"]) < 0.05
