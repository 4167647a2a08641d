"""config: one frozen dataclass of six sections; TOML < flags; every bad value is a one-line
ConfigError."""

import dataclasses
import itertools
import json
import re
import tomllib
from pathlib import Path

import pytest

from mirrorfit.config import (
    MAX_CLASSES,
    MAX_IMAGE_SIDE,
    SECTIONS,
    CheckpointSettings,
    DataSettings,
    OptimisationSettings,
    TrainConfig,
    check_outputs,
    load_config,
    to_dict,
)
from mirrorfit.errors import ConfigError


def test_defaults_are_the_chapters_mlp_recipe():
    c = load_config()
    assert (c.model, c.optimizer, c.lr, c.batch_size, c.epochs) == ("mlp", "sgd", 0.01, 32, 10)


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config().epochs = 3


def test_flags_override_toml(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('model = "cnn"\nepochs = 3\nsteps-per-execution = 7\nlr = 1\n')
    c = load_config(f, epochs=5, model=None)
    assert (c.model, c.epochs, c.steps_per_execution, c.lr) == ("cnn", 5, 7, 1.0)


def test_train_table_is_accepted(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[train]\nreplicas = 2\ndevices = ["/cpu:0", "/cpu:1"]\n')
    c = load_config(f)
    assert c.replicas == 2 and c.devices == ("/cpu:0", "/cpu:1")


def test_top_level_keys_and_train_table_are_merged(tmp_path):
    """TOML puts keys written before a [train] header at the top level: they count too."""
    f = tmp_path / "run.toml"
    f.write_text('epochs = 3\nsteps-per-execution = 7\n[train]\nmodel = "cnn"\n')
    c = load_config(f)
    assert (c.epochs, c.steps_per_execution, c.model) == (3, 7, "cnn")


def test_key_both_top_level_and_in_train_table_is_refused(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("steps-per-execution = 7\n[train]\nsteps_per_execution = 9\n")
    with pytest.raises(
        ConfigError, match="sets 'steps_per_execution' both at the top level and under \\[train\\]"
    ):
        load_config(f)


def test_unknown_key_names_it_and_suggests(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("epoch = 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key .*'epoch'.*did you mean 'epochs'"):
        load_config(f)


@pytest.mark.parametrize(
    "toml,match",
    [
        ('epochs = "ten"', "epochs"),
        ("epochs = 0", "--epochs must be a positive integer"),
        ("batch_size = -4", "batch-size"),
        ('strategy = "ring"', "unknown strategy 'ring'"),
        ('optimizer = "lion"', "unknown optimizer 'lion'"),
        ("lr = -1.0", "--lr must be a finite number > 0, got -1.0"),
        ("lr = 0", "--lr must be a finite number > 0"),
        ("lr = inf", "--lr must be a finite number > 0, got inf; e.g. --lr 0.01"),
        ("lr = nan", "--lr must be a finite number > 0, got nan"),
        ("warmup-epochs = inf", "--warmup-epochs must be a finite number >= 0, got inf"),
        ("warmup-epochs = nan", "--warmup-epochs must be a finite number >= 0, got nan"),
        ("warmup-epochs = -0.5", "--warmup-epochs must be a finite number >= 0"),
        ("seed = 4294967296", "--seed must be an integer from 0 to 2\\*\\*32 - 1.*got 4294967296"),
        ("seed = -1", "--seed must be an integer from 0"),
        ("checkpoint-every = -1", "--checkpoint-every must be >= 0"),
        # without a folder it was ignored, exit 0 and no checkpoint (fit refused it)
        ("checkpoint-every = 5", "--checkpoint-every 5 needs --checkpoint-dir DIR"),
        ("fresh = true", "--fresh needs --checkpoint-dir DIR"),
        # without a SavedModel to shape it was ignored, exit 0 (a hostile pass, cdbafe7)
        ("export-preprocessing = true", "--export-preprocessing shapes the SavedModel that "),
        ("epochs = [", "not valid TOML"),
        ("train = 3", "'train' must be a \\[train\\] table"),
    ],
)
def test_bad_values_are_named(tmp_path, toml, match):
    f = tmp_path / "run.toml"
    f.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=match):
        load_config(f)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.toml")


def test_unreadable_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path)  # a folder
    f = tmp_path / "run.toml"
    f.write_bytes(b"epochs = 3 \xff\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"seed": 2**32}, "--seed must be an integer"),
        ({"seed": 2**32 - 1}, None),
        ({"lr": float("inf")}, "--lr must be a finite number"),
        ({"warmup_epochs": float("inf")}, "--warmup-epochs must be a finite number"),
        ({"warmup_epochs": 0}, None),
        # A warm-up past the run kept the rate ~0 all run (1e300: an overflow warning, no error).
        ({"warmup_epochs": 1e300}, r"--warmup-epochs 1e\+300 is more than --epochs 10"),
        ({"warmup_epochs": 3, "epochs": 2}, "--warmup-epochs 3 is more than --epochs 2"),
        ({"warmup_epochs": 2, "epochs": 2}, None),
    ],
)
def test_flag_values_are_checked_like_toml_values(overrides, match):
    if match is None:
        load_config(**overrides)
    else:
        with pytest.raises(ConfigError, match=match):
            load_config(**overrides)


def test_batch_sizes_per_replica_and_global():
    assert TrainConfig(batch_size=32).batch_sizes(2) == (32, 64)
    assert TrainConfig(global_batch_size=64).batch_sizes(2) == (32, 64)


def test_global_batch_not_divisible_by_replicas():
    with pytest.raises(ConfigError, match="global batch size 33 is not divisible by 2 replicas"):
        TrainConfig(global_batch_size=33).batch_sizes(2)


def test_requires_python_admits_no_python_without_tomllib():
    """Config files are read with tomllib, which Python has from 3.11 on."""
    from packaging.specifiers import SpecifierSet

    from conftest import ROOT

    spec = SpecifierSet(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    )
    assert "3.10.14" not in spec and "3.11.0" in spec


def test_paths_from_the_python_api_are_kept_as_text(tmp_path, mnist_dir):
    """A Path for a path setting is accepted (TrainConfig or load_config) and kept as a str:
    the config goes into the JSON summary at the end of a run, where a Path failed after
    training. Anything else for --data-dir is a ConfigError, not a TypeError."""
    c = TrainConfig(
        data_dir=Path(mnist_dir), metrics_out=tmp_path / "m.json", checkpoint_dir=tmp_path / "ckpt"
    )
    assert (c.data_dir, c.metrics_out, c.checkpoint_dir) == (
        str(mnist_dir),
        str(tmp_path / "m.json"),
        str(tmp_path / "ckpt"),
    )
    assert load_config(data_dir=Path(mnist_dir)).data_dir == str(mnist_dir)
    json.dumps(to_dict(c))
    for bad in (5, ["a"], str(mnist_dir).encode()):
        with pytest.raises(ConfigError, match="--data-dir must be a path, got"):
            TrainConfig(data_dir=bad)


def test_data_settings_from_toml_and_flags(tmp_path):
    """--data and its flags take TOML values too (sizes as "H,W" or a list); --dataset is the
    older name of --data; a flag that does not apply to the source is refused by name."""
    (tmp_path / "imgs").mkdir()
    f = tmp_path / "run.toml"
    f.write_text(
        f'data = "{tmp_path / "imgs"}"\nimage-size = [64, 48]\nvalidation-split = 0.2\n'
        'cache = "memory"\nnum-classes = 5\n'
    )
    c = load_config(f)
    assert (c.image_size, c.validation_split, c.cache, c.num_classes) == (
        (64, 48),
        0.2,
        "memory",
        5,
    )
    assert load_config(f, image_size="32,32").image_size == (32, 32)
    assert load_config(dataset="mnist").data == "mnist"
    assert load_config(data="synthetic", input_shape="224,224,3").input_shape == (224, 224, 3)
    with pytest.raises(ConfigError, match="--label-feature names a TFRecord feature"):
        load_config(f, label_feature="y")
    with pytest.raises(ConfigError, match="--image-size resizes images read from files"):
        load_config(data="synthetic", image_size="28,28")


def test_image_size_is_bounded_per_side(tmp_path):
    """Every image is resized to --image-size: a side past MAX_IMAGE_SIDE is refused with the
    value and the limit, from a flag or TOML, before anything is decoded."""
    (tmp_path / "imgs").mkdir()
    folder = str(tmp_path / "imgs")
    assert load_config(data=folder, image_size=f"{MAX_IMAGE_SIDE},32").image_size == (
        MAX_IMAGE_SIDE,
        32,
    )
    for size in (f"{MAX_IMAGE_SIDE + 1},32", "32,1048576"):
        with pytest.raises(ConfigError) as info:
            load_config(data=folder, image_size=size)
        assert str(info.value) == (
            f"--image-size {size}: at most {MAX_IMAGE_SIDE} pixels a "
            "side; e.g. --image-size 224,224"
        )
    f = tmp_path / "run.toml"
    f.write_text(f'data = "{folder}"\nimage-size = [100000, 100000]\n')
    with pytest.raises(ConfigError, match=f"--image-size 100000,100000: at most {MAX_IMAGE_SIDE}"):
        load_config(f)


@pytest.mark.parametrize(
    "overrides, flag",
    [
        ({"strategy": "mirrored", "communication": "nccl"}, "--communication"),
        ({"strategy": "multi-worker", "cross_device_ops": "nccl"}, "--cross-device-ops"),
        ({"strategy": "parameter-server", "xla": True}, "--xla"),
        ({"threads_per_worker": 100_000}, "--threads-per-worker"),
    ],
)
def test_cluster_flags_that_would_be_ignored_or_harmful_are_refused(overrides, flag):
    with pytest.raises(ConfigError, match=flag):
        load_config(**overrides)


def test_replicas_beyond_what_one_process_drives_are_refused_before_any_device():
    """100,000 replicas hung both engines' device set-up for minutes: refused at once."""
    assert load_config(replicas=1024, global_batch_size=1024).replicas == 1024
    with pytest.raises(ConfigError) as info:
        load_config(replicas=100_000)
    assert str(info.value).startswith(
        "--replicas 100000 is more devices than one process drives; use at most 1024"
    )


def test_image_size_is_bounded_by_the_values_of_one_example(tmp_path):
    """A side within MAX_IMAGE_SIDE can still make an example too large: H x W x 3 is capped
    at --input-shape's limit (8192,8192 was 201M values, 805 MB per float32 example)."""
    folder = tmp_path / "imgs"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    assert load_config(data=str(folder), image_size="4096,4096").image_size == (4096, 4096)
    with pytest.raises(ConfigError) as info:
        load_config(data=str(folder), image_size="8192,8192")
    assert str(info.value) == (
        "--image-size 8192,8192: 201,326,592 values per example at 3 "
        "channels, more than 67,108,864; e.g. --image-size 224,224"
    )


def test_num_classes_is_bounded():
    assert load_config(num_classes=MAX_CLASSES).num_classes == MAX_CLASSES
    with pytest.raises(ConfigError, match=r"--num-classes 99999999999: at most 1,000,000; "):
        load_config(num_classes=99999999999)


# -- the sections: TrainConfig is all six at once --------------------------------------------
def test_train_config_is_the_sections_fields_flat_in_order():
    """TrainConfig inherits every section: a name two sections both defined would silently be
    one of them there, so they share none but ``check``."""
    names = [{n for n in vars(s) if not n.startswith("__")} for s in SECTIONS]
    for a, b in itertools.combinations(names, 2):
        assert a & b <= {"check"}
    fields = [f.name for s in SECTIONS for f in dataclasses.fields(s)]
    assert [f.name for f in dataclasses.fields(TrainConfig)] == fields
    assert len(fields) == len(set(fields)) == len(to_dict(load_config()))


def test_a_section_checks_itself_with_train_configs_messages(tmp_path):
    with pytest.raises(ConfigError, match="--lr must be a finite number > 0, got 0;"):
        OptimisationSettings(lr=0)
    with pytest.raises(ConfigError, match="--keep-checkpoints must be a positive integer"):
        CheckpointSettings(keep_checkpoints=0)
    with pytest.raises(ConfigError, match="--image-size resizes images read from files"):
        DataSettings(data="synthetic", image_size="28,28")
    assert DataSettings(data="synthetic", input_shape="4,4,1").input_shape == (4, 4, 1)
    assert CheckpointSettings(checkpoint_dir=tmp_path).checkpoint_dir == str(tmp_path)


def test_replace_checks_again_and_cross_section_checks_run(tmp_path):
    config = load_config(replicas=2)
    assert dataclasses.replace(config, lr=0.5).lr == 0.5
    with pytest.raises(ConfigError, match="--lr must be a finite number > 0"):
        dataclasses.replace(config, lr=0)
    # --replicas (distribution) against --global-batch-size (optimisation)
    with pytest.raises(ConfigError, match="global batch size 33 is not divisible by 2 replicas"):
        dataclasses.replace(config, global_batch_size=33)
    with pytest.raises(
        ConfigError,
        match="--export-dir writes a TensorFlow SavedModel, which the jax engine does not",
    ):
        load_config(backend="jax", export_dir=str(tmp_path / "models" / "m"))


# -- check_outputs: where a run writes, checked before anything loads -------------------------
def _outputs(tmp_path):
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    return tmp_path


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"checkpoint_dir": "{t}/f.txt"}, "--checkpoint-dir {t}/f.txt is a file; give a folder"),
        (
            {"logdir": "{t}/f.txt/runs"},
            "--logdir {t}/f.txt/runs: {t}/f.txt is a file, not a folder",
        ),
        (
            {"export_dir": "{t}/dangling"},
            "--export-dir {t}/dangling: {t}/dangling is a link to nothing",
        ),
        (
            {"metrics_out": "{t}/f.txt/m.json"},
            "--metrics-out {t}/f.txt/m.json: {t}/f.txt is a file, not a folder",
        ),
        ({"metrics_out": "{t}/a\0b/m.json"}, "contains a NUL character"),
        (
            {"save_keras": "{t}/m.keras", "metrics_out": "{t}/m.keras"},
            "--metrics-out and --save-keras are both {t}/m.keras",
        ),
        ({"checkpoint_dir": "/proc/mirrorfit-ckpt"}, "cannot write in /proc"),
        ({"metrics_out": "/proc/m.json"}, "--metrics-out /proc/m.json: cannot write in /proc"),
    ],
)
def test_outputs_that_cannot_be_written_are_refused_by_flag(tmp_path, overrides, match):
    t = _outputs(tmp_path)
    if "/proc" in str(overrides) and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc (a folder no one may create files in)")
    config = load_config(**{k: v.format(t=t) for k, v in overrides.items()})
    with pytest.raises(ConfigError, match=re.escape(match.format(t=t))):
        check_outputs(config)
    assert sorted(p.name for p in t.iterdir()) == ["dangling", "f.txt"]  # nothing made


def test_outputs_that_can_be_written_pass_and_leave_nothing(tmp_path):
    check_outputs(
        load_config(
            metrics_out=str(tmp_path / "m.json"),
            save_keras=str(tmp_path / "m.keras"),
            export_dir=str(tmp_path / "models" / "mnist"),
            checkpoint_dir=str(tmp_path / "ckpt"),
            logdir=str(tmp_path / "runs" / "a"),
        )
    )
    assert list(tmp_path.iterdir()) == []  # the write probes are gone, no folder made yet
