"""schedules: linear learning-rate scaling and warm-up (Goyal et al.)."""

import keras
import numpy as np
import pytest

import mirrorfit
from mirrorfit.models.schedules import LinearWarmup, learning_rate, scaled_lr


def test_linear_scaling_multiplies_by_global_over_base_batch():
    assert scaled_lr(0.01, global_batch=256, base_batch=32, scaling="linear") == pytest.approx(0.08)
    assert scaled_lr(0.01, global_batch=256, base_batch=32, scaling="none") == 0.01


def test_warmup_ramps_linearly_from_the_unscaled_rate_to_the_scaled_one():
    lr = learning_rate(0.01, global_batch=128, base_batch=32, scaling="linear", warmup_steps=4)
    assert isinstance(lr, LinearWarmup)
    values = [float(lr(step)) for step in range(6)]
    np.testing.assert_allclose(values, [0.0175, 0.025, 0.0325, 0.04, 0.04, 0.04], rtol=1e-6)


def test_no_warmup_gives_a_plain_rate():
    assert learning_rate(
        0.01, global_batch=64, base_batch=32, scaling="linear", warmup_steps=0
    ) == pytest.approx(0.02)


def test_warmup_survives_the_optimizer_config_round_trip():
    # the trainer rebuilds optimizers from their config inside the strategy scope
    opt = keras.optimizers.SGD(LinearWarmup(target_lr=0.04, warmup_steps=10, initial_lr=0.01))
    copy = keras.optimizers.SGD.from_config(opt.get_config())
    assert isinstance(copy._learning_rate, LinearWarmup)
    assert copy._learning_rate.get_config() == {
        "target_lr": 0.04,
        "warmup_steps": 10,
        "initial_lr": 0.01,
    }


def test_unknown_scaling_is_a_config_error():
    with pytest.raises(mirrorfit.ConfigError, match="unknown lr scaling 'sqrt'"):
        scaled_lr(0.1, global_batch=64, base_batch=32, scaling="sqrt")


@pytest.mark.parametrize(
    "lr,scaling,fix",
    [
        (
            1e308,
            "linear",
            r"--lr 1e\+308 scaled to inf \(x 64/1, --lr-scaling linear\).*lower --lr "
            "or raise --base-batch",
        ),
        (
            1e37,
            "linear",
            r"scaled to 6.4e\+38",
        ),  # finite in float64, inf in the optimizer's float32
        (1e39, "none", r"--lr 1e\+39 is not a usable float32 learning rate; use e.g. --lr 0.01"),
        (1e-50, "none", "--lr 1e-50 is not a usable float32"),  # 0 in float32: nothing would train
    ],
)
def test_a_rate_the_optimizer_cannot_hold_is_refused(lr, scaling, fix):
    # It used to print "learning rate: inf", train NaN and exit 0.
    with pytest.raises(mirrorfit.ConfigError, match=fix):
        learning_rate(lr, global_batch=64, base_batch=1, scaling=scaling, warmup_steps=0)
    with pytest.raises(mirrorfit.ConfigError, match=fix):
        learning_rate(lr, global_batch=64, base_batch=1, scaling=scaling, warmup_steps=5)
