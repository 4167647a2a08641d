"""engine.jax.step (through the runner): the JAX engine's compiled step is the update one device
makes on the whole global batch, whatever the replicas and micro-batches, with one all-reduce per
optimizer step and no retracing.

Each replica count runs in a fresh interpreter (XLA's host device count is read when JAX starts)
with TensorFlow blocked: the JAX engine must not import it.
"""

import pytest

from conftest import assert_same_weights, run_isolated, runs_by_replicas

TRAIN = """
import os, sys, json
sys.modules["tensorflow"] = None  # the JAX engine never imports it
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
from mirrorfit.engine import jax as engine
placement = engine.build_distribution(engine.configure_devices(replicas={replicas}))
import keras, mirrorfit
data = mirrorfit.load_mnist(train_examples=2048, download=False)
results = {{}}
for name, optimizer, accum, spe in {runs!r}:
    engine.seed(7)
    opt = {{"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}}[optimizer]
    trainer = mirrorfit.Trainer(strategy=placement, model=mirrorfit.models.mlp, optimizer=opt,
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=128, steps_per_execution=spe, accum_steps=accum)
    init = [w.copy() for w in trainer.model.get_weights()]
    history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=128,
                                                  seed=3), epochs=2)
    np.savez(f"{out}/{{name}}.npz", *trainer.model.get_weights())
    changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
    results[name] = {{"steps": history.steps, "traced": trainer.tracing_count(),
                      "changed": changed, "loss": history.epochs[-1]["loss"],
                      "tensorflow": sys.modules.get("tensorflow") is not None}}
print(json.dumps(results))
"""
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
    return runs_by_replicas(TRAIN, RUNS, tmp_path_factory.mktemp("weights"))


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


ALL_REDUCES = """
import os, sys, json, re
sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
from mirrorfit.engine import jax as engine
placement = engine.build_distribution(engine.configure_devices(replicas=2))
import jax, keras, mirrorfit
from jax.sharding import NamedSharding, PartitionSpec as P
out = {}
for accum in (1, 4):
    trainer = mirrorfit.Trainer(strategy=placement, model=mirrorfit.models.cnn,
                                optimizer=keras.optimizers.Adam(1e-3),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=32, accum_steps=accum)
    runner = trainer.runner
    split = NamedSharding(placement.mesh, P(None, "data"))
    xs = jax.device_put(np.zeros((3, 32, 28, 28), np.uint8), split)
    ys = jax.device_put(np.zeros((3, 32), np.int32), split)
    text = runner._steps.train.lower(runner._state, xs, ys, np.int32(3)).compile().as_text()
    out[accum] = len(re.findall(r" all-reduce(?:-start)?\\(", text))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_one_all_reduce_per_optimizer_step_whatever_the_micro_batches():
    counts = run_isolated(ALL_REDUCES)
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


RNN = """
import os, sys, json
sys.modules["tensorflow"] = None
os.environ["KERAS_BACKEND"] = "jax"
import numpy as np
from mirrorfit.engine import jax as engine
placement = engine.build_distribution(engine.configure_devices(replicas={replicas}))
import keras, mirrorfit
data = mirrorfit.load_mnist(train_examples=256, download=False)
out = {{}}
for name, in {runs!r}:
    engine.seed(3)
    def lstm():
        inputs = keras.Input((28, 28))
        return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(
            keras.layers.LSTM(16)(inputs)))
    trainer = mirrorfit.Trainer(strategy=placement, model=lstm,
                                optimizer=keras.optimizers.SGD(0.1),
                                loss=keras.losses.SparseCategoricalCrossentropy(),
                                global_batch=32, steps_per_execution=4)
    init = [w.copy() for w in trainer.model.get_weights()]
    trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=1),
                epochs=1)
    np.savez(f"{out}/{{name}}.npz", *trainer.model.get_weights())
    out[name] = {{"changed": max(float(np.abs(a - b).max())
                                 for a, b in zip(init, trainer.model.get_weights()))}}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_an_lstm_trains_on_two_devices_to_the_weights_of_one(tmp_path):
    """An LSTM's zero initial state is the same on every device and its scan's carry is not:
    under shard_map's replication check the step failed to trace (any RNN, any replicas)."""
    runs = runs_by_replicas(RNN, {"one": (1,), "two": (2,)}, tmp_path)
    assert runs["one"]["changed"] > 1e-4
    assert_same_weights(runs["one"]["weights"], runs["two"]["weights"], rtol=1e-4, atol=2e-6)
