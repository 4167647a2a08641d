"""engine.trainer (with step and loop): data-parallel training that matches one device.

Each case runs in a fresh interpreter with N logical CPU devices (they must be set before
TensorFlow starts) and saves the trained weights for comparison here.
"""

import numpy as np
import pytest

from conftest import run_isolated

TRAIN = """
import json, sys, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas={replicas})
strategy = mirrorfit.build_strategy(setup, kind="{strategy}")
data = mirrorfit.load_mnist(train_examples=2048, download=False)
keras.utils.set_random_seed(7)
opt = {{"sgd": keras.optimizers.SGD(0.05), "adam": keras.optimizers.Adam(1e-3)}}["{optimizer}"]
trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp, optimizer=opt,
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64,
                            steps_per_execution={spe})
init = [w.copy() for w in trainer.model.get_weights()]
history = trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64,
                                              seed=3), epochs=2)
np.savez("{out}", *trainer.model.get_weights())
changed = max(float(np.abs(a - b).max()) for a, b in zip(init, trainer.model.get_weights()))
print(json.dumps({{"steps": history.steps, "traced": trainer.tracing_count(),
                  "changed": changed, "loss": history.epochs[-1]["loss"]}}))
"""


def _train(tmp_path, *, replicas=1, strategy="auto", optimizer="sgd", spe=8):
    out = tmp_path / f"w_{replicas}_{strategy}_{optimizer}_{spe}.npz"
    info = run_isolated(TRAIN.format(replicas=replicas, strategy=strategy, optimizer=optimizer,
                                     spe=spe, out=out))
    with np.load(out) as f:
        info["weights"] = [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
    return info


def _assert_same_weights(a, b, rtol, atol):
    assert len(a) == len(b)
    for wa, wb in zip(a, b):
        np.testing.assert_allclose(wa, wb, rtol=rtol, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_two_replicas_give_the_same_weights_as_one(tmp_path, optimizer):
    one = _train(tmp_path, replicas=1, optimizer=optimizer)
    two = _train(tmp_path, replicas=2, optimizer=optimizer)
    assert one["steps"] == two["steps"] == 2 * (2048 // 64)
    assert one["changed"] > 1e-3  # it did train
    _assert_same_weights(one["weights"], two["weights"], rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_central_storage_matches_one_replica(tmp_path):
    one = _train(tmp_path, replicas=1)
    cs = _train(tmp_path, replicas=2, strategy="central-storage")
    _assert_same_weights(one["weights"], cs["weights"], rtol=1e-4, atol=2e-5)


@pytest.mark.slow
def test_steps_per_execution_does_not_change_the_result(tmp_path):
    ten = _train(tmp_path, replicas=2, spe=10)  # 32 steps: 10+10+10+2, a shorter last call
    one = _train(tmp_path, replicas=2, spe=1)
    _assert_same_weights(ten["weights"], one["weights"], rtol=1e-6, atol=1e-7)
    assert ten["traced"] == 1 and one["traced"] == 1  # step counts are tensors: no retracing


EVAL = """
import json, numpy as np, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
data = mirrorfit.load_mnist(train_examples=512, download=False)
trainer = mirrorfit.Trainer(strategy=strategy, model=mirrorfit.models.mlp,
                            optimizer=keras.optimizers.SGD(0.1),
                            loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64)
trainer.fit(mirrorfit.train_batches(data.x_train, data.y_train, global_batch=64, seed=0),
            epochs=1)
x, y = data.x_test[:1001], data.y_test[:1001]
result = trainer.evaluate((x, y), batch_size=64)
probs = trainer.model.predict(x / 255.0, verbose=0)
expected_acc = float(np.mean(np.argmax(probs, 1) == y))
expected_loss = float(np.mean(-np.log(probs[np.arange(len(y)), y])))
print(json.dumps({"result": result, "acc": expected_acc, "loss": expected_loss}))
"""


@pytest.mark.slow
def test_evaluation_counts_each_example_once_when_not_divisible():
    out = run_isolated(EVAL)
    assert out["result"]["examples"] == 1001  # 15 full batches of 64 + a partial one of 41
    assert out["result"]["accuracy"] == pytest.approx(out["acc"], abs=1e-6)
    assert out["result"]["loss"] == pytest.approx(out["loss"], rel=1e-4)


OUTSIDE = """
import json, keras, mirrorfit
setup = mirrorfit.configure_devices(replicas=2)
strategy = mirrorfit.build_strategy(setup)
model = mirrorfit.models.mlp()  # built outside strategy.scope()
try:
    mirrorfit.Trainer(strategy=strategy, model=model, optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=64)
    print(json.dumps({"error": None}))
except mirrorfit.ConfigError as e:
    print(json.dumps({"error": str(e)}))
"""


@pytest.mark.slow
def test_model_built_outside_the_scope_is_refused_clearly():
    assert "not created under this strategy" in run_isolated(OUTSIDE)["error"]


def test_a_position_past_the_end_of_an_epoch_is_refused_clearly():
    # A trainer restored from a checkpoint of other data once ran out of batches in its last
    # epoch (an OutOfRangeError traceback); the checkpoint now refuses such a resume, and the
    # trainer says so itself for a Python-API caller.
    import keras
    import mirrorfit

    x = np.zeros((128, 28, 28), np.uint8)
    y = np.zeros(128, np.int32)
    trainer = mirrorfit.Trainer(strategy=mirrorfit.build_strategy(mirrorfit.configure_devices()),
                                model=mirrorfit.models.mlp, optimizer=keras.optimizers.SGD(0.1),
                                loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=32)
    trainer.step_in_epoch = 6  # of an epoch of 4 steps
    with pytest.raises(mirrorfit.ConfigError, match="at step 6 of an epoch of only 4 steps"):
        trainer.fit(mirrorfit.train_batches(x, y, global_batch=32, seed=0), epochs=1)
