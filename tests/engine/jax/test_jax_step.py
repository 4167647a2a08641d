"""engine.jax.step, as mirrorfit.fit's JAX runner compiles it: one all-reduce per optimizer
step whatever the micro-batches, and one call on the devices at a time where a step runs per
call. (That the step's update is the one Keras's own fit makes on one device, for every kind
of model, with accumulation and several steps a call: tests/fitting/test_fit.py.)
"""

from pathlib import Path

import pytest

from conftest import run_isolated

HERE = Path(__file__).parent


@pytest.mark.slow
def test_one_all_reduce_per_optimizer_step_whatever_the_micro_batches():
    counts = run_isolated(HERE / "all_reduces_driver.py")
    # the compiled loop holds one all-reduce (of all gradients at once) per step: K=4
    # micro-batches add none
    assert counts == {"1": 1, "4": 1}


def test_steps_one_call_each_wait_for_the_previous_call(monkeypatch):
    """A model that runs one step per call (convolutions on a CPU) has at most one call on the
    devices at a time: queued calls took every thread of XLA's CPU pool with one device's
    parts, blocked in the all-reduce, and the process aborted after 40 s (2 of 3 runs of the
    CNN on 2 logical devices)."""
    jax = pytest.importorskip("jax")
    from mirrorfit.engine.jax.step import _Train

    events = []

    def single(state, xs, ys, at):
        events.append(("call", int(at)))
        return state + 1

    monkeypatch.setattr(
        jax, "block_until_ready", lambda tree: events.append(("wait", int(tree))) or tree
    )
    train = _Train(looped=None, single=single, one_by_one=lambda state, xs: True)
    assert train(0, None, None, 3) == 3
    assert events == [("call", 0), ("wait", 1), ("call", 1), ("wait", 2), ("call", 2), ("wait", 3)]
