"""schedules: linear learning-rate scaling and warm-up (Goyal et al.)."""

import keras
import numpy as np
import pytest

import mirrorfit
from mirrorfit.schedules import LinearWarmup, learning_rate, scaled_lr


def test_linear_scaling_multiplies_by_global_over_base_batch():
    assert scaled_lr(0.01, global_batch=256, base_batch=32, scaling="linear") == pytest.approx(0.08)
    assert scaled_lr(0.01, global_batch=256, base_batch=32, scaling="none") == 0.01


def test_warmup_ramps_linearly_from_the_unscaled_rate_to_the_scaled_one():
    lr = learning_rate(0.01, global_batch=128, base_batch=32, scaling="linear", warmup_steps=4)
    assert isinstance(lr, LinearWarmup)
    values = [float(lr(step)) for step in range(6)]
    np.testing.assert_allclose(values, [0.0175, 0.025, 0.0325, 0.04, 0.04, 0.04], rtol=1e-6)


def test_no_warmup_gives_a_plain_rate():
    assert learning_rate(0.01, global_batch=64, base_batch=32, scaling="linear",
                         warmup_steps=0) == pytest.approx(0.02)


def test_warmup_survives_the_optimizer_config_round_trip():
    # the trainer rebuilds optimizers from their config inside the strategy scope
    opt = keras.optimizers.SGD(LinearWarmup(target_lr=0.04, warmup_steps=10, initial_lr=0.01))
    copy = keras.optimizers.SGD.from_config(opt.get_config())
    assert isinstance(copy._learning_rate, LinearWarmup)
    assert copy._learning_rate.get_config() == {"target_lr": 0.04, "warmup_steps": 10,
                                                "initial_lr": 0.01}


def test_unknown_scaling_is_a_config_error():
    with pytest.raises(mirrorfit.ConfigError, match="unknown lr scaling 'sqrt'"):
        scaled_lr(0.1, global_batch=64, base_batch=32, scaling="sqrt")
