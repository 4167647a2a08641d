"""config: one frozen dataclass; TOML < flags; every bad value is a one-line ConfigError."""

import dataclasses

import pytest

from mirrorfit.config import TrainConfig, load_config
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


def test_unknown_key_names_it_and_suggests(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text("epoch = 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key .*'epoch'.*did you mean 'epochs'"):
        load_config(f)


@pytest.mark.parametrize("toml,match", [
    ('epochs = "ten"', "epochs"),
    ("epochs = 0", "epochs must be a positive integer"),
    ("batch_size = -4", "batch_size"),
    ('strategy = "ring"', "unknown strategy 'ring'"),
    ('optimizer = "lion"', "unknown optimizer 'lion'"),
    ("lr = -1.0", "lr must be > 0"),
    ("epochs = [", "not valid TOML"),
])
def test_bad_values_are_named(tmp_path, toml, match):
    f = tmp_path / "run.toml"
    f.write_text(toml + "\n")
    with pytest.raises(ConfigError, match=match):
        load_config(f)


def test_missing_config_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/run.toml")


def test_batch_sizes_per_replica_and_global():
    assert TrainConfig(batch_size=32).batch_sizes(2) == (32, 64)
    assert TrainConfig(global_batch_size=64).batch_sizes(2) == (32, 64)


def test_global_batch_not_divisible_by_replicas():
    with pytest.raises(ConfigError, match="global batch size 33 is not divisible by 2 replicas"):
        TrainConfig(global_batch_size=33).batch_sizes(2)
