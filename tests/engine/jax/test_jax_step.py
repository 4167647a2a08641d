"""engine.jax.step (through the runner): the JAX engine's compiled step is the update one device
makes on the whole global batch, whatever the replicas and micro-batches, with one all-reduce per
optimizer step and no retracing.

Each replica count runs in a fresh interpreter (XLA's host device count is read when JAX starts)
with TensorFlow blocked: the JAX engine must not import it.
"""

from pathlib import Path

import pytest

from conftest import assert_same_weights, run_isolated, runs_by_replicas

HERE = Path(__file__).parent

# name: (replicas, optimizer, accumulation steps, steps per execution)
RUNS = {
    "one_sgd": (1, "sgd", 1, 8),
    "one_adam": (1, "adam", 1, 8),
    "two_sgd": (2, "sgd", 1, 8),
    "two_adam": (2, "adam", 1, 8),
    "one_accum4": (1, "sgd", 4, 8),
    "two_accum4": (2, "sgd", 4, 8),
    "spe5": (2, "sgd", 1, 5),
    "spe1": (2, "sgd", 1, 1),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return runs_by_replicas(HERE / "step_runs_driver.py", RUNS, tmp_path_factory.mktemp("weights"))


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_devices_give_the_weights_of_one(runs, optimizer):
    one, two = runs[f"one_{optimizer}"], runs[f"two_{optimizer}"]
    assert one["steps"] == two["steps"] == 2 * (2048 // 128)
    assert one["changed"] > 1e-3  # it did train
    assert_same_weights(one["weights"], two["weights"], rtol=1e-4, atol=2e-6)
    assert not one["tensorflow"] and not two["tensorflow"]


@pytest.mark.slow
def test_accumulation_over_four_micro_batches_is_one_batch_four_times_larger(runs):
    # the same global batch of 128: four micro-batches of 32 (on 1 device) or of 16 (each of 2
    # devices) sum to the gradient of the whole batch, all-reduced once
    for accumulated in ("one_accum4", "two_accum4"):
        assert_same_weights(
            runs["one_sgd"]["weights"], runs[accumulated]["weights"], rtol=1e-4, atol=2e-6
        )


@pytest.mark.slow
def test_steps_per_execution_does_not_change_the_result_nor_retrace(runs):
    five, one = runs["spe5"], runs["spe1"]  # 16 steps an epoch: 5+5+5+1, a shorter last call
    assert_same_weights(five["weights"], one["weights"], rtol=1e-6, atol=1e-7)
    assert five["traced"] == 1 and one["traced"] == 1


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


@pytest.mark.slow
def test_an_lstm_trains_on_two_devices_to_the_weights_of_one(tmp_path):
    """An LSTM's zero initial state is the same on every device and its scan's carry is not:
    under shard_map's replication check the step failed to trace (any RNN, any replicas)."""
    runs = runs_by_replicas(HERE / "lstm_runs_driver.py", {"one": (1,), "two": (2,)}, tmp_path)
    assert runs["one"]["changed"] > 1e-4
    assert_same_weights(runs["one"]["weights"], runs["two"]["weights"], rtol=1e-4, atol=2e-6)
