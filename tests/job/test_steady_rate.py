"""job.steady_rate: steady examples/s from the callbacks fit calls, with a clock the test
moves: the first call (its compile) and the validations between calls left out, a partial
last batch counted as what it holds."""

from __future__ import annotations

import pytest

from mirrorfit.job import steady_rate as module


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    made = Clock()
    monkeypatch.setattr(module.time, "perf_counter", made)
    return made


def test_the_first_call_and_validation_are_left_out(clock):
    rate = module.steady_rate(examples_per_epoch=250, global_batch=100)  # 3 steps an epoch
    rate.on_train_begin()
    for epoch in range(2):
        rate.on_epoch_begin(epoch)
        for step, seconds in ((0, 10.0 if epoch == 0 else 1.0), (1, 1.0), (2, 0.5)):
            clock.now += seconds
            rate.on_train_batch_end(step)
        rate.on_test_begin()
        clock.now += 7.0  # validation: not training
        rate.on_test_end()
        rate.on_epoch_end(epoch)
    # after the first call: 150 + 250 examples in 1 + 0.5 + 1 + 1 + 0.5 s
    assert rate.rate() == pytest.approx(400 / 4.0)


def test_no_steady_figure_without_a_second_call_or_a_known_length(clock):
    once = module.steady_rate(examples_per_epoch=100, global_batch=100)
    once.on_train_begin()
    clock.now += 1.0
    once.on_train_batch_end(0)
    assert once.rate() is None
    unknown = module.steady_rate(examples_per_epoch=0, global_batch=100)
    unknown.on_train_begin()
    for step in range(3):
        clock.now += 1.0
        unknown.on_train_batch_end(step)
    assert unknown.rate() is None
