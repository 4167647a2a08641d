"""engine.jax.sharding (--shard): a state split over the devices trains to the weights of the
replicated one (2 and 4 logical devices, mirrorfit.fit with SGD, Adam over 2 micro-batches and
AdamW, 2 worker processes), holds about 1/N of what it splits, and its step reduce-scatters and
all-gathers instead of all-reducing the gradients. The driver is
``sharding_driver.py``, one fresh interpreter per device count."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import BLOCKED_CLI, ROOT, _env, run_cli, keras_file_weights

HERE = Path(__file__).parent


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


@pytest.fixture(scope="module")
def driven(tmp_path_factory):
    out = {}
    for replicas in (2, 4):
        folder = tmp_path_factory.mktemp(f"shard{replicas}")
        proc = subprocess.run(
            [sys.executable, str(HERE / "sharding_driver.py"), str(replicas), str(folder)],
            capture_output=True,
            text=True,
            timeout=600,
            env=_env(),
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        out[replicas] = (json.loads(proc.stdout.strip().splitlines()[-1]), folder)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("mode", ["optimizer", "all"])
def test_a_split_state_trains_to_the_weights_of_the_replicated_one(driven, replicas, mode):
    report, folder = driven[replicas]
    assert not report["tensorflow"]
    for run in ("{}-sgd", "{}-adam", "{}-adamw"):
        whole = _load(folder / (run.format("none") + ".npz"))
        _same(_load(folder / (run.format(mode) + ".npz")), whole)
    initial = _load(folder / "none-sgd.npz")  # it trained: the two optimizers differ
    assert (
        max(float(np.abs(a - b).max()) for a, b in zip(initial, _load(folder / "none-adam.npz")))
        > 1e-3
    )


@pytest.mark.slow
def test_each_device_holds_its_share_of_what_is_split(driven):
    for report, _ in driven.values():
        runs = report["runs"]
        assert runs["optimizer-sgd"] == runs["none-sgd"]  # SGD keeps no state
        assert runs["optimizer-adam"] < runs["none-adam"]
        assert runs["all-adam"] < runs["optimizer-adam"]
    wide = driven[4][0]["wide"]
    weights, state = wide["none"]["weights"], wide["none"]["optimizer"]
    assert wide["none"]["bytes"] >= weights + state
    slack = 0.01 * (weights + state)  # the biases and step counter stay whole
    assert wide["optimizer"]["bytes"] <= weights + state / 4 + slack
    assert wide["all"]["bytes"] <= (weights + state) / 4 + slack


def _elements(shape: str) -> list[int]:
    return [
        math.prod(int(d) for d in dims.split(",") if d)
        for dims in re.findall(r"\[([\d,]*)\]", shape)
    ]


@pytest.mark.slow
def test_the_split_step_reduce_scatters_and_gathers_and_all_reduces_no_gradient(driven):
    wide = driven[4][0]["wide"]
    # replicated: one all-reduce of every gradient, the 512 x 512 kernels among them
    assert len(wide["none"]["all_reduce_shapes"]) == 1
    assert max(_elements(wide["none"]["all_reduce_shapes"][0])) == 512 * 512
    assert wide["none"]["reduce_scatters"] == wide["none"]["all_gathers"] == 0
    for mode in ("optimizer", "all"):
        # the 9 kernels: one reduce-scatter each per step (K=2 micro-batches), and one
        # all-gather (optimizer: of the updated slices) or two per micro-batch (all: in the
        # forward pass and again in the backward; fit unrolls the 2); only the biases (512 or
        # 16 values) are all-reduced
        assert wide[mode]["reduce_scatters"] == 9
        assert wide[mode]["all_gathers"] == {"optimizer": 9, "all": 36}[mode]
        assert wide[f"{mode}-k1"]["all_gathers"] == {"optimizer": 9, "all": 18}[mode]
        sizes = [n for shape in wide[mode]["all_reduce_shapes"] for n in _elements(shape)]
        assert sizes and max(sizes) <= 512, wide[mode]["all_reduce_shapes"]


@pytest.mark.slow
def test_all_gathers_the_weights_layer_by_layer(driven):
    """Under ``all`` a step's scratch memory holds about one layer's whole weights, not the
    model's: 8 x Dense(512) on 4 devices, each kernel 1 MiB whole."""
    wide = driven[4][0]["wide"]
    weights, kernel = wide["none"]["weights"], 512 * 512 * 4
    assert weights > 8 * kernel
    # one micro-batch: nor is a gradient kept whole past its reduce-scatter (gathering all
    # the weights at the step's start held 8 MiB here)
    assert wide["all-k1"]["temp"] <= 2.5 * kernel, wide["all-k1"]
    # two: the gradients are summed whole, to be reduce-scattered once per step (17 MiB)
    assert wide["all-k2"]["temp"] <= weights + 2.5 * kernel, wide["all-k2"]


TRAIN = [
    "--backend",
    "jax",
    "--train-examples",
    "2048",
    "--optimizer",
    "adam",
    "--lr",
    "0.001",
    "--no-progress",
    "--steps-per-execution",
    "4",
    "--global-batch-size",
    "64",
]


@pytest.mark.slow
def test_a_checkpoint_of_four_split_devices_resumes_on_two_to_the_uninterrupted_run(tmp_path):
    first = run_cli(
        "train",
        *TRAIN,
        "--replicas",
        "4",
        "--shard",
        "all",
        "--epochs",
        "1",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        without_tensorflow=True,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "the weights and the optimizer state (FSDP) split over 4 devices" in first.stderr
    resumed = run_cli(
        "train",
        *TRAIN,
        "--replicas",
        "2",
        "--shard",
        "optimizer",
        "--epochs",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--save-keras",
        str(tmp_path / "resumed.keras"),
        "--metrics-out",
        str(tmp_path / "resumed.json"),
        without_tensorflow=True,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr
    whole = run_cli(
        "train",
        *TRAIN,
        "--replicas",
        "2",
        "--epochs",
        "2",
        "--save-keras",
        str(tmp_path / "whole.keras"),
        "--metrics-out",
        str(tmp_path / "whole.json"),
        without_tensorflow=True,
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    for a, b in zip(
        keras_file_weights(tmp_path / "resumed.keras"),
        keras_file_weights(tmp_path / "whole.keras"),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    split, replicated = (
        json.loads((tmp_path / f"{n}.json").read_text()) for n in ("resumed", "whole")
    )
    assert split["shard"] == "optimizer" and replicated["shard"] == "none"
    assert split["state_bytes_per_device"] < replicated["state_bytes_per_device"]
    assert split["peak_device_bytes"] is None  # CPUs report none


@pytest.mark.slow
def test_two_worker_processes_split_the_state_and_train_as_one_process(tmp_path):
    args = [*TRAIN, "--accum-steps", "2", "--epochs", "2"]
    launch = subprocess.run(
        [
            sys.executable,
            "-m",
            "mirrorfit",
            "launch",
            "--workers",
            "2",
            "--",
            sys.executable,
            str(BLOCKED_CLI),
            "tensorflow",
            "train",
            "--strategy",
            "multi-worker",
            "--threads-per-worker",
            "1",
            "--shard",
            "all",
            *args,
            "--save-keras",
            str(tmp_path / "mw.keras"),
            "--checkpoint-dir",
            str(tmp_path / "ck"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(_env(), TMPDIR=str(tmp_path)),
        cwd=ROOT,
    )
    assert launch.returncode == 0, (launch.stdout + launch.stderr)[-4000:]
    assert "split over 2 devices" in launch.stdout + launch.stderr
    one = run_cli(
        "train",
        *args,
        "--replicas",
        "2",
        "--save-keras",
        str(tmp_path / "one.keras"),
        without_tensorflow=True,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    for a, b in zip(
        keras_file_weights(tmp_path / "mw.keras"),
        keras_file_weights(tmp_path / "one.keras"),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_shard_is_refused_in_one_line_where_it_cannot_apply():
    on_tf = run_cli("train", "--shard", "all", without_tensorflow=True)
    assert on_tf.returncode == 2
    assert on_tf.stderr.strip() == (
        "mirrorfit: error: --shard all splits the training state "
        "over the devices on the JAX engine only; add --backend "
        "jax, or drop --shard"
    )
    bogus = run_cli("train", "--backend", "jax", "--shard", "zero3", without_tensorflow=True)
    assert bogus.returncode == 2 and "--shard 'zero3': choose none" in bogus.stderr
    assert len(bogus.stderr.strip().splitlines()) == 1


def test_the_rule_splits_large_parameters_along_their_first_dividing_axis():
    from mirrorfit.engine.jax.sharding import shard_axis

    assert shard_axis((784, 100), 4) == 0
    assert shard_axis((784, 99), 3) == 1  # 784 is not a multiple of 3
    assert shard_axis((100,), 4) is None  # under 1,024 values
    assert shard_axis((785, 101), 4) is None  # no axis divides
    assert shard_axis((64, 64), 4, constrained=True) is None
    assert shard_axis((64, 64), 1) is None


def _built(optimizer):
    import keras

    model = keras.Sequential(
        [keras.Input((784,)), keras.layers.Dense(64, name="hidden"), keras.layers.Dense(10)]
    )
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_optimizers_that_read_whole_tensors_are_refused_in_one_line():
    import keras

    from mirrorfit.engine.jax.sharding import build_layout
    from mirrorfit.errors import ConfigError

    class MyAdam(keras.optimizers.Adam):
        pass

    for optimizer, named in (
        (keras.optimizers.Adafactor(), "Adafactor"),
        (keras.optimizers.Adam(clipnorm=1.0), "clipnorm"),
        (keras.optimizers.Adam(global_clipnorm=1.0), "global_clipnorm"),
        (MyAdam(), "MyAdam"),
    ):
        with pytest.raises(ConfigError, match=named) as e:
            build_layout("all", *_built(optimizer), 4)
        assert "\n" not in str(e.value)
    assert build_layout("all", *_built(keras.optimizers.Adam(clipvalue=1.0)), 4) is not None


def test_the_copy_for_the_slices_keeps_weight_decay_exclusions_and_rate_functions():
    import keras

    from mirrorfit.engine.jax.sharding import build_layout

    optimizer = keras.optimizers.AdamW(1e-3, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    layout = build_layout("optimizer", *_built(optimizer), 4)
    local = layout.local_optimizer
    decayed = {v.name: local._use_weight_decay(v) for v in local._trainable_variables}
    assert decayed == {"kernel": True, "bias": False}
    by_list = keras.optimizers.AdamW(1e-3, weight_decay=0.5)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64), keras.layers.Dense(10)])
    by_list.exclude_from_weight_decay(var_list=[model.layers[0].kernel])
    by_list.build(model.trainable_variables)
    local = build_layout("all", model, by_list, 4).local_optimizer
    assert [local._use_weight_decay(v) for v in local._trainable_variables] == [
        False,
        True,
        True,
        True,
    ]
    # a learning rate given as a function (not serialisable) is shared, not rebuilt
    rate = build_layout("all", *_built(keras.optimizers.SGD(lambda: 0.05)), 4)
    assert rate.local_optimizer._learning_rate() == 0.05


def test_a_run_with_nothing_to_split_says_why():
    from mirrorfit.engine.jax.sharding import describe_unsplit

    assert describe_unsplit("none", 4) == "replicated (--shard none)"
    assert "one device has nothing to split" in describe_unsplit("all", 1)
    assert "no parameter splits over 3 devices" in describe_unsplit("optimizer", 3)


@pytest.mark.slow
def test_the_gathered_layers_train_when_differentiated_twice_or_called_in_a_loop():
    """Under ``all``: a loss that differentiates the model twice (a penalty on its input
    gradient) left the gathered layer's split kernel still (its backward pass gathered the
    weights from the shards, which carry no gradient: 0.0 against 0.0059 under ``none``), and
    a layer called in ``fori_loop`` or ``cond`` failed to trace (its backward rule read shards
    from a trace that had ended)."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "gather_driver.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    moved = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("penalty", "loop", "branch"):
        assert min(moved[f"{name}-none"]) > 1e-4, moved  # every weight trained
        np.testing.assert_allclose(moved[f"{name}-all"], moved[f"{name}-none"], rtol=1e-5)
