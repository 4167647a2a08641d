"""job.finish: everything after the loop. The summary a run returns is what --metrics-out
holds and the "done" line reports; only the chief writes it and the exports; a resumed run that
has nothing left to train still reports where it stands. A tiny model on synthetic data, one
replica, in this process."""

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
from mirrorfit.job.finish import Run, finish


def _model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Flatten(),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )


def test_summary_is_written_by_the_chief_only_and_a_finished_run_still_reports(tmp_path):
    config = load_config(
        data="synthetic",
        input_shape="4,4,1",
        num_classes=3,
        epochs=1,
        train_examples=32,
        batch_size=8,
        steps_per_execution=2,
        metrics_out=str(tmp_path / "m.json"),
        save_keras=str(tmp_path / "model.keras"),
    )
    dist = Distribution(
        strategy=tf.distribute.get_strategy(), kind="single", replicas=1, local_replicas=1
    )
    setup = DeviceSetup(kind="CPU", devices=("/cpu:0",), physical=("/cpu:0",), shared_cores=False)
    data = load_run_data(config, 8, dist)
    trainer = Trainer(
        strategy=dist,
        model=_model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=8,
        steps_per_execution=2,
    )
    out = io.StringIO()
    console = Console(file=out, soft_wrap=True)

    def run(config, dist):
        history = trainer.fit(data.train, epochs=config.epochs, validation=data.val)
        return finish(
            Run(
                config=config,
                console=console,
                trainer=trainer,
                data=data,
                setup=setup,
                dist=dist,
                factory=_model,
                guard=PreemptionGuard(),
            ),
            history,
        )

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
    other = dataclasses.replace(
        config, metrics_out=str(tmp_path / "w.json"), save_keras=str(tmp_path / "w.keras")
    )
    again = run(other, dataclasses.replace(dist, is_chief=False))
    assert (again["steps"], again["steps_this_run"]) == (4, 0)  # the whole run's, and none here
    assert again["final_train_loss"] is None
    assert "nothing to train: 1 of 1 epochs already done" in out.getvalue()
    assert not (tmp_path / "w.json").exists() and not (tmp_path / "w.keras").exists()


def test_a_resumed_run_reports_its_rate_and_the_whole_runs_steps(tmp_path):
    """A resumed run's first epoch said 0 examples/s (its steps were all in the run's first
    execution, which is left out of the steady rate as it compiles), and the summary's steps
    counted only the steps after the resume (64 of 124)."""
    config = load_config(
        data="synthetic",
        input_shape="4,4,1",
        num_classes=3,
        epochs=2,
        train_examples=32,
        batch_size=8,
        steps_per_execution=4,
        metrics_out=str(tmp_path / "m.json"),
    )
    dist = Distribution(
        strategy=tf.distribute.get_strategy(), kind="single", replicas=1, local_replicas=1
    )
    setup = DeviceSetup(kind="CPU", devices=("/cpu:0",), physical=("/cpu:0",), shared_cores=False)
    data = load_run_data(config, 8, dist)
    trainer = Trainer(
        strategy=dist,
        model=_model,
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=8,
        steps_per_execution=4,
    )
    trainer.fit(data.train, epochs=1)  # the run before the resume: epoch 1, 4 steps
    history = trainer.fit(data.train, epochs=2)  # the resumed run: epoch 2, one execution
    assert history.epochs[0]["examples_per_sec"] > 0, history.epochs
    out = io.StringIO()
    summary = finish(
        Run(
            config=config,
            console=Console(file=out, soft_wrap=True),
            trainer=trainer,
            data=data,
            setup=setup,
            dist=dist,
            factory=_model,
            guard=PreemptionGuard(),
        ),
        history,
    )
    assert (summary["steps"], summary["steps_this_run"]) == (8, 4)
    assert summary["train_examples_per_sec"] > 0
    assert json.loads((tmp_path / "m.json").read_text())["steps"] == 8
    assert "done: 8 steps (4 in this run, resumed at step 4) in" in out.getvalue(), out.getvalue()
