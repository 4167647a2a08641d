"""Resuming with changed settings, hand-edited metadata, data and names (issue 10's review):
a rerun resumes exactly or refuses in one line naming the flag, its original value and --fresh;
a healthy checkpoint is never called corrupt."""

import json
import os

import keras
import numpy as np
import pytest

from mirrorfit.engine import backends

from mirrorfit.artifacts.checksums import sealed

from test_checkpoint import _drive, _trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def batches(mnist_dir):
    import mirrorfit

    data = mirrorfit.load_mnist(str(mnist_dir), train_examples=256, download=False)
    return mirrorfit.train_batches(data.x_train, data.y_train, global_batch=32, seed=0)


def test_changed_settings_are_refused_by_name_before_the_state_is_read(tmp_path):
    base = [
        "train",
        "--model",
        "user_models:tiny",
        "--train-examples",
        "256",
        "--no-progress",
        "--checkpoint-dir",
        str(tmp_path / "c"),
    ]
    refused = {  # flags of the rerun -> what the one line must say
        # Keras restored its learning-rate variable: "0.5" was printed, 0.01 was used.
        ("--lr", "0.5"): "written with --lr 0.01, this run has --lr 0.5: resume with --lr 0.01",
        # TensorFlow's "Found 1 Python objects that were not bound", reported as corruption.
        ("--warmup-epochs", "0"): "written with --warmup-epochs 1.0, this run has "
        "--warmup-epochs 0.0: resume with --warmup-epochs 1.0",
        ("--precision", "fp16"): "written with --precision fp32, this run has --precision fp16",
        ("--optimizer", "adam"): "written with --optimizer sgd, this run has --optimizer adam",
        ("--lr-scaling", "linear", "--base-batch", "16"): "written with --lr-scaling none, this "
        "run has --lr-scaling linear",
        ("--model", "user_models:tiny_dropout"): "written with --model user_models:tiny, this "
        "run has --model user_models:tiny_dropout",
    }
    same = ["--lr", "0.01", "--warmup-epochs", "1"]
    runs = [[*base, *same, "--epochs", "1"]]
    runs += [[*base, *same, "--epochs", "2", *flags] for flags in refused]  # the last flag wins
    # What may change: the run's length and how steps are executed. Resumes.
    runs.append(
        [
            *base,
            *same,
            "--epochs",
            "2",
            "--steps-per-execution",
            "3",
            "--metrics-out",
            str(tmp_path / "m.json"),
        ]
    )
    first_run, *results, resumed = _drive(runs, {}, {})
    assert first_run["code"] == 0, first_run["err"][-3000:]
    for (flags, expected), got in zip(refused.items(), results):
        lines = [ln for ln in got["err"].splitlines() if ln.startswith("mirrorfit: error")]
        assert got["code"] == 2 and len(lines) == 1, (flags, got["err"][-3000:])
        assert expected in lines[0] and "--fresh" in lines[0], (flags, lines[0])
        assert "cannot be read" not in lines[0]
    assert resumed["code"] == 0, resumed["err"][-3000:]
    assert "resuming from" in resumed["err"] and "(epoch 2, step 0)" in resumed["err"]
    assert json.loads((tmp_path / "m.json").read_text())["learning_rate"] == pytest.approx(0.01)
    assert sorted(p.name for p in (tmp_path / "c").glob("epoch-*")) == [
        "epoch-000001",
        "epoch-000002",
    ]


def test_a_structure_mismatch_is_other_settings_not_corruption(tmp_path, batches):
    """Through the Python API (no flags recorded), a checkpoint whose objects do not match is
    refused as written with other settings; neither it nor an older one is moved aside."""
    from mirrorfit.artifacts.checkpoint import CheckpointError, Checkpointer
    from mirrorfit.models.schedules import LinearWarmup

    import mirrorfit
    from user_models import tiny

    def trainer(lr):
        strategy = mirrorfit.build_strategy(mirrorfit.configure_devices())
        return mirrorfit.Trainer(
            strategy=strategy,
            model=tiny,
            optimizer=keras.optimizers.SGD(lr),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            global_batch=32,
        )

    warm = trainer(LinearWarmup(target_lr=0.01, warmup_steps=8, initial_lr=0.0))
    ckpt = Checkpointer(tmp_path, trainer=warm, model_spec="tiny", data=batches.order)
    warm.fit(batches, epochs=2, callbacks=[ckpt.epoch_callback])
    notices = []
    ckpt = Checkpointer(
        tmp_path,
        trainer=trainer(0.01),
        model_spec="tiny",
        data=batches.order,
        on_notice=notices.append,
    )
    with pytest.raises(
        CheckpointError,
        match="ckpt-000000016 was written with other settings "
        r"\(AssertionError.*--fresh",
    ):
        ckpt.restore_latest()
    assert not notices
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-000000008", "ckpt-000000016"]


def test_other_training_data_with_the_same_count_is_refused(tmp_path, batches):
    import mirrorfit
    from mirrorfit.artifacts.checkpoint import CheckpointError, Checkpointer

    Checkpointer(
        tmp_path,
        trainer=_trainer(),
        model_spec="tiny",
        data=batches.order,
        flags={"fingerprint": {"--data-dir": "/a/mnist.npz"}},
    ).save()
    other = mirrorfit.train_batches(batches.x, (batches.y + 1) % 10, global_batch=32, seed=0)
    ckpt = Checkpointer(
        tmp_path,
        trainer=_trainer(),
        model_spec="tiny",
        data=other.order,
        flags={"fingerprint": {"--data-dir": "/b/mnist.npz"}},
    )
    with pytest.raises(
        CheckpointError,
        match=r"trained with training data [0-9a-f]{16}, this run "
        r"has [0-9a-f]{16} \(--data-dir /a/mnist.npz -> "
        r"/b/mnist.npz\): resume with --data-dir "
        "/a/mnist.npz, or pass --fresh",
    ):
        ckpt.restore_latest()
    same = mirrorfit.train_batches(batches.x.copy(), batches.y.copy(), global_batch=32, seed=0)
    assert (
        Checkpointer(tmp_path, trainer=_trainer(), model_spec="tiny", data=same.order)
        .restore_latest()
        .step
        == 0
    )


@pytest.mark.parametrize(
    "edit,problem",
    [
        ({"identity": []}, "identity is list, not an object"),
        ({"data": []}, "data is not an object of plain values"),
        ({"flags": {"seed": 5}}, "flags is not an object of flag -> value objects"),
        ({"step": "8"}, "step is '8', not a count >= 0"),
        ({"identity": {"model": "tiny"}}, "identity needs model and optimizer names"),
        ({"settings": {"--lr": [1]}}, "settings is not an object of plain values"),
        ({"epoch_logs": {"loss": "0.5"}}, "epoch_logs is not an object of numbers"),
    ],
)
def test_hand_edited_metadata_is_one_line_naming_the_file(tmp_path, edit, problem):
    from mirrorfit.artifacts.checkpoint import CheckpointError, Checkpointer, load_model

    trainer = _trainer()
    path = Checkpointer(tmp_path, trainer=trainer, model_spec="tiny").save()
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, **edit}))
    for attempt in (
        Checkpointer(tmp_path, trainer=trainer, model_spec="tiny").restore_latest,
        lambda: load_model(tmp_path, read_state=backends.read_model, model="tiny"),
    ):
        with pytest.raises(
            CheckpointError,
            match=f"ckpt-000000000 cannot be read "
            rf"\(meta.json: {problem}",
        ):
            attempt()


def test_a_checkpoint_does_not_choose_the_code_that_runs(tmp_path):
    from mirrorfit.artifacts.checkpoint import CheckpointError, Checkpointer, load_model

    Checkpointer(tmp_path, trainer=_trainer(), model_spec="user_models:tiny").save()
    with pytest.raises(
        CheckpointError,
        match="holds the user model user_models:tiny, whose code "
        "would be imported and run; pass --model "
        "user_models:tiny to allow it",
    ):
        load_model(tmp_path, read_state=backends.read_model)
    with pytest.raises(CheckpointError, match="pass --model user_models:tiny$"):
        load_model(tmp_path, read_state=backends.read_model, model="mlp")
    model, meta = load_model(tmp_path, read_state=backends.read_model, model="user_models:tiny")
    assert model.name == "tiny" and meta["step"] == 0


def test_names_are_unique_and_checkpoint_names_ascii(tmp_path):
    from mirrorfit.artifacts.checkpoint import Checkpointer, list_checkpoints

    ckpt = Checkpointer(tmp_path, trainer=_trainer(), model_spec="tiny")
    asides = []
    for _ in range(3):  # --fresh three times within a second used to raise FileExistsError
        ckpt.save()
        asides.append(ckpt.discard())
    assert len(set(asides)) == 3 and all((a / "ckpt-000000000").is_dir() for a in asides)
    for name in ("ckpt-٣", "ckpt-5\n", "ckpt-000000007"):
        (tmp_path / name).mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-000000007"]


def test_only_this_hosts_dead_writers_checkpoint_temps_are_cleaned(tmp_path):
    from mirrorfit import _io
    from mirrorfit.artifacts.checkpoint import Checkpointer

    host, rand = _io.temp_tag().split("-")[0], "0" * 32
    dead = f".ckpt-000000016.tmp-{host}-{2**40}-{rand}"  # no such process id can exist
    kept = [
        f".ckpt-000000016.tmp-{host}-{os.getpid()}-{rand}",  # alive: this process
        f".ckpt-000000016.tmp-{format(int(host, 16) ^ 1, '08x')}-1-{rand}",  # other host
        ".ckpt-backup.tmp-1",
    ]  # not ours
    for name in [dead, *kept]:
        (tmp_path / name).mkdir()
    Checkpointer(tmp_path, trainer=_trainer(), model_spec="tiny").clean_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


@pytest.mark.parametrize("written_by", ["format 4", "format 3"])
def test_a_resume_after_an_epochs_end_does_not_report_it_again(tmp_path, batches, written_by):
    """A step hook's checkpoint at an epoch's last step is also that epoch's (the epoch-end save
    finds it and records the end): resuming from it must not report the finished epoch again.
    A format 3 checkpoint kept the step hook's position: it counts as ended, as it always did."""
    from mirrorfit.artifacts.checkpoint import Checkpointer

    first = _trainer()
    steps = batches.steps_per_epoch  # 8
    ckpt = Checkpointer(tmp_path, trainer=first, model_spec="tiny", data=batches.order, every=steps)
    first.fit(batches, epochs=1, hooks=[ckpt.step_hook], callbacks=[ckpt.epoch_callback])
    file = tmp_path / f"ckpt-{steps:09d}" / "meta.json"
    meta = json.loads(file.read_text())
    assert (meta["epoch"], meta["step_in_epoch"], meta["epoch_logs"]) == (1, 0, None)
    if written_by == "format 3":
        del meta["epoch_logs"]
        file.write_text(json.dumps({**meta, "epoch": 0, "step_in_epoch": steps, "format": 3}))

    for epochs, reported in ((2, [2]), (1, [])):
        resumed = _trainer()
        Checkpointer(
            tmp_path, trainer=resumed, model_spec="tiny", data=batches.order
        ).restore_latest()
        seen = []
        history = resumed.fit(
            batches, epochs=epochs, callbacks=[lambda e, logs, seen=seen: seen.append(e)]
        )
        assert seen == reported and len(history.epochs) == len(reported)
        assert all(logs["loss"] > 0 for logs in history.epochs)
        assert (resumed.epoch, resumed.step_in_epoch) == (epochs, 0)


class _Stop(Exception):
    pass


def _stop_at_epoch_1(epoch, logs):
    if epoch == 1:  # e.g. a failing callback, or the preemption guard's
        raise _Stop


def test_a_run_stopped_before_an_epochs_end_runs_that_end_once_on_resume(tmp_path, batches):
    """The step hook saved at epoch 1's last step, then the run stopped before epoch 1's end
    (validation, callbacks, its save) completed. The resumed run runs that end once, with the
    training metrics epoch 1 had, and ends with the weights of a run never stopped."""
    import shutil

    from mirrorfit.artifacts.checkpoint import Checkpointer

    steps = batches.steps_per_epoch  # 8
    val = (batches.x[:96], batches.y[:96])

    def run(trainer, epochs, callbacks=(), hooks=()):
        seen = []
        history = trainer.fit(
            batches,
            epochs=epochs,
            validation=val,
            hooks=hooks,
            callbacks=[lambda e, logs: seen.append((e, dict(logs))), *callbacks],
        )
        return seen, history

    ref = _trainer()
    want, _ = run(ref, 2)

    stopped = _trainer()
    ckpt = Checkpointer(
        tmp_path / "c", trainer=stopped, model_spec="tiny", data=batches.order, every=steps
    )
    with pytest.raises(_Stop):
        run(stopped, 2, [_stop_at_epoch_1, ckpt.epoch_callback], [ckpt.step_hook])
    meta = json.loads((tmp_path / "c" / f"ckpt-{steps:09d}" / "meta.json").read_text())
    assert (meta["epoch"], meta["step_in_epoch"]) == (0, steps)  # epoch 1's end is still to run
    assert meta["epoch_logs"]["loss"] == pytest.approx(want[0][1]["loss"], rel=1e-6)
    shutil.copytree(tmp_path / "c", tmp_path / "no_logs")

    resumed = _trainer()
    ckpt = Checkpointer(
        tmp_path / "c", trainer=resumed, model_spec="tiny", data=batches.order, every=steps
    )
    restored = ckpt.restore_latest()
    assert (restored.epoch, restored.step_in_epoch, restored.ended) == (0, steps, False)
    seen, history = run(resumed, 2, [ckpt.epoch_callback], [ckpt.step_hook])
    assert [e for e, _ in seen] == [1, 2] and len(history.epochs) == 2
    assert history.steps == steps  # epoch 1's end ran without a step
    for (_, got), (_, expected) in zip(seen, want):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
            assert got[key] == pytest.approx(expected[key], rel=1e-6), key
    for a, b in zip(resumed.model.get_weights(), ref.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Epoch 1's end is recorded now: a resume from that step would not run it again.
    meta = json.loads((tmp_path / "c" / f"ckpt-{steps:09d}" / "meta.json").read_text())
    assert (meta["epoch"], meta["step_in_epoch"], meta["epoch_logs"]) == (1, 0, None)

    # A checkpoint that did not keep the metrics: its epoch's end reports NaN, not zeros.
    file = tmp_path / "no_logs" / f"ckpt-{steps:09d}" / "meta.json"
    file.write_text(json.dumps(sealed({**json.loads(file.read_text()), "epoch_logs": None})))
    last = _trainer()
    Checkpointer(
        tmp_path / "no_logs", trainer=last, model_spec="tiny", data=batches.order
    ).restore_latest()
    ((epoch, logs),) = run(last, 1)[0]  # only epoch 1's end is left: no input is set up
    assert epoch == 1 and np.isnan(logs["loss"]) and np.isnan(logs["accuracy"])
    assert logs["val_loss"] == pytest.approx(want[0][1]["val_loss"], rel=1e-6)
    assert (last.epoch, last.step_in_epoch) == (1, 0)


@pytest.mark.parametrize(
    "step_in_epoch,ended,says",
    [
        (
            8,
            False,
            "1 epoch(s) done, epoch 2's 8 steps trained, running its end (validation, "
            "callbacks) first (global step 16)",
        ),
        (8, True, "2 epoch(s) done, continuing epoch 3 at step 0 (global step 16)"),  # format < 4
        (3, False, "1 epoch(s) done, continuing epoch 2 at step 3 (global step 11)"),
    ],
)
def test_the_resume_line_says_whether_an_epochs_end_is_still_to_run(
    tmp_path, step_in_epoch, ended, says
):
    """At an epoch's last step before its end, the resumed run first runs that end and prints
    that epoch's line: the resume line must not call the epoch done."""
    from types import SimpleNamespace

    from mirrorfit.artifacts.checkpoint import Restored
    from mirrorfit.engine.controller import resume

    restored = Restored(
        tmp_path / "ckpt", epoch=1, step_in_epoch=step_in_epoch, step=8 + step_in_epoch, ended=ended
    )
    checkpointer = SimpleNamespace(clean_partial=lambda: None, restore_latest=lambda: restored)
    dist = SimpleNamespace(agree=lambda flag: flag, all_equal=lambda value: True, task="chief")
    printed = []
    resume(checkpointer, dist, steps_per_epoch=8, fresh=False, say=printed.append)
    assert printed == [f"resuming from {tmp_path / 'ckpt'}: {says}"]


def test_a_hand_edited_data_value_of_another_type_is_shown_as_such(tmp_path, batches):
    """data.global_batch "32" in meta.json (a string) was refused with "trained with global
    batch 32, this run has 32": both sides look the same."""
    from mirrorfit.artifacts.checkpoint import CheckpointError, Checkpointer

    path = Checkpointer(tmp_path, trainer=_trainer(), model_spec="tiny", data=batches.order).save()
    meta = json.loads((path / "meta.json").read_text())
    meta["data"]["global_batch"] = str(meta["data"]["global_batch"])
    (path / "meta.json").write_text(json.dumps(sealed(meta)))  # resealed: behind the checksum
    ckpt = Checkpointer(tmp_path, trainer=_trainer(), model_spec="tiny", data=batches.order)
    with pytest.raises(CheckpointError, match="trained with global batch '32', this run has 32"):
        ckpt.restore_latest()
