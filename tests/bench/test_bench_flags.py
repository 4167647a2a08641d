"""`mirrorfit bench --data/--model/--input-shape/--num-classes`: bad values are one line and
exit code 2 before any process starts (in this process: the check is plain Python)."""

import pytest

from mirrorfit.cli import main


@pytest.mark.parametrize("args, needle", [
    (["--model", "resnet50"], "unknown model 'resnet50' (did you mean 'ResNet50'?); use mlp, cnn"),
    (["--model", "ResNet50"], "use --data synthetic --input-shape 32,32,3"),
    (["--model", "ResNet50", "--data", "synthetic", "--input-shape", "16,16,3"],
     "--input-shape 16,16,3: --model ResNet50 needs images of at least 32x32 pixels"),
    (["--model", "InceptionV3", "--data", "synthetic", "--input-shape", "224,224"],
     "height,width,channels"),
    (["--data", "synthetic", "--num-classes", "0"], "--num-classes must be 2 or more"),
    (["--data", "cifar10"], "bench measures on mnist or synthetic"),
])
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
    assert "--input-shape 'a,b,3': expected a comma-separated list of int" in \
        capsys.readouterr().err
