"""job.finish: everything after the loop. The summary a run returns is what --metrics-out
holds and the "done" line reports; only the chief writes it and the exports; a resumed run that
has nothing left to train still reports where it stands. A tiny model on synthetic data, one
replica, in this process."""

import contextlib
import dataclasses
import io
import json

import keras
import tensorflow as tf
from rich.console import Console

from mirrorfit.config import load_config
from mirrorfit.engine.tensorflow.devices import DeviceSetup
from mirrorfit.engine.tensorflow.distribution import Distribution
from mirrorfit.engine.controller import Trainer
from mirrorfit.job.preemption import PreemptionGuard
from mirrorfit.job.data import load_run_data
from mirrorfit.job.finish import finish


def _model() -> keras.Model:
    return keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(),
                             keras.layers.Dense(3, activation="softmax")])


def test_summary_is_written_by_the_chief_only_and_a_finished_run_still_reports(tmp_path):
    config = load_config(data="synthetic", input_shape="4,4,1", num_classes=3, epochs=1,
                         train_examples=32, batch_size=8, steps_per_execution=2,
                         metrics_out=str(tmp_path / "m.json"),
                         save_keras=str(tmp_path / "model.keras"))
    dist = Distribution(strategy=tf.distribute.get_strategy(), kind="single", replicas=1,
                        local_replicas=1)
    setup = DeviceSetup(kind="CPU", devices=("/cpu:0",), physical=("/cpu:0",),
                        shared_cores=False)
    data = load_run_data(config, 8, dist)
    trainer = Trainer(strategy=dist, model=_model, optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(), global_batch=8,
                      steps_per_execution=2)
    out = io.StringIO()
    console = Console(file=out, soft_wrap=True)

    def run(config, dist):
        history = trainer.fit(data.train, epochs=config.epochs, validation=data.val)
        return finish(config, console, history, trainer=trainer, data=data,
                      batches=data.train, setup=setup, dist=dist, factory=_model,
                      usage=contextlib.nullcontext(), guard=PreemptionGuard())

    summary = run(config, dist)
    assert (summary["steps"], summary["train_examples"], summary["epochs"]) == (4, 32, 1)
    assert (summary["test_accuracy"], summary["test_examples"]) == (None, 0)
    assert summary["devices"] == ["/cpu:0"] and summary["data"]["kind"] == "synthetic"
    assert summary["keras_file"] == str(tmp_path / "model.keras")
    assert keras.models.load_model(summary["keras_file"]).count_params() == 51
    assert json.loads((tmp_path / "m.json").read_text()) == json.loads(json.dumps(summary))
    assert "done: 4 steps in" in out.getvalue()
    assert "no validation or test data" in out.getvalue()

    # Another worker evaluates and returns the same summary, but writes nothing.
    other = dataclasses.replace(config, metrics_out=str(tmp_path / "w.json"),
                                save_keras=str(tmp_path / "w.keras"))
    again = run(other, dataclasses.replace(dist, is_chief=False))
    assert again["steps"] == 0 and again["final_train_loss"] is None
    assert "nothing to train: 1 of 1 epochs already done" in out.getvalue()
    assert not (tmp_path / "w.json").exists() and not (tmp_path / "w.keras").exists()
