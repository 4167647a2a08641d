"""The end of a training run, after the loop: test evaluation, the summary (returned, printed
as the "done" line, written to --metrics-out), the --profile report and the exports."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from rich.console import Console

from mirrorfit import _io
from mirrorfit.config import TrainConfig, to_dict
from mirrorfit.job.divergence import check_updates
from mirrorfit.job.observe import out_of_memory_hint
from mirrorfit.job.preemption import PreemptionGuard
from mirrorfit.data.file_errors import data_errors
from mirrorfit.job.data import input_source


def state_line(runner) -> str:
    """The start screen's line on what each device holds (``runner``: an engine's)."""
    return (
        f"state: {runner.describe_sharding()}; "
        f"{runner.state_bytes_per_device() / 2**20:,.1f} MiB per device"
    )


def state_fields(runner, shard: str) -> dict[str, Any]:
    """--metrics-out's fields on what each device holds."""
    return {
        "shard": shard,
        "state_bytes_per_device": runner.state_bytes_per_device(),
        "peak_device_bytes": runner.peak_device_bytes(),
    }  # GPUs; None elsewhere


@dataclass(frozen=True)
class Run:
    """One training run's parts, as the stages after the loop read them."""

    config: TrainConfig
    console: Console
    trainer: Any  # mirrorfit.Trainer
    data: Any  # the loaded data (mirrorfit.data.sources.Data)
    setup: Any  # the DeviceSetup
    dist: Any  # the engine's distribution
    factory: Callable[[], Any]  # builds the model afresh (the exports' copy)
    guard: PreemptionGuard
    usage: Any = None  # --profile's CPU/GPU sampler
    clock: Any = None  # where the time went, phase by phase


def finish(run: Run, history) -> dict[str, Any]:
    """Test evaluation, summary, profile and exports: everything after the training loop.
    The run's guard stops it before the exports commit if a signal arrives. Every worker
    evaluates (the evaluation's collectives need them all); only the chief writes."""
    config, trainer = run.config, run.trainer
    t0 = time.perf_counter()
    last, val, test = _evaluate(run, history)
    summary = _summary(run, history, last, val, test, test_eval_time_s=time.perf_counter() - t0)
    _say_done(run, history, summary)
    check_updates(trainer)  # fp16: every update skipped is a run that trained nothing
    if config.profile:
        summary["profile"] = _profile(run, history)
    run.guard.check()
    trainer.runner.sync()  # on every worker: a state split over processes is gathered
    if not run.dist.is_chief:
        return summary
    summary.update(_exports(run))
    if run.clock is not None:  # where the whole run's time went (seconds, phase by phase)
        run.clock.lap("test_and_outputs")
        summary["timings_s"] = run.clock.timings
    if config.metrics_out:
        _io.write_json_atomic(config.metrics_out, summary)
    return summary


def _evaluate(run: Run, history) -> tuple[dict, dict, dict]:
    """The last epoch's logs, and the validation and test results (a resumed run that was
    already done evaluates its validation data here)."""
    config, trainer, data = run.config, run.trainer, run.data
    per_replica, global_batch = config.batch_sizes(run.dist.replicas)
    eval_batch = config.eval_batch_size or global_batch
    none = {"loss": None, "accuracy": None, "examples": 0}
    with out_of_memory_hint(per_replica), data_errors(data):
        test = none if data.test is None else trainer.evaluate(data.test, batch_size=eval_batch)
        if history.epochs:
            last = history.epochs[-1]
            return last, {"loss": last.get("val_loss"), "accuracy": last.get("val_accuracy")}, test
        # resumed a finished run: nothing trained, but still report where it stands
        run.console.print(
            f"nothing to train: {trainer.epoch} of {config.epochs} epochs already done"
        )
        val = none if data.val is None else trainer.evaluate(data.val, batch_size=eval_batch)
    return {}, val, test


def _summary(run: Run, history, last, val, test, *, test_eval_time_s: float) -> dict[str, Any]:
    """--metrics-out's record of the run (returned by run_training too)."""
    config, trainer, data, dist = run.config, run.trainer, run.data, run.dist
    per_replica, global_batch = config.batch_sizes(dist.replicas)
    summary = {
        "model": config.model,
        "precision": config.precision,
        "xla": trainer.jit_compile,
        "accum_steps": config.accum_steps,
        "replicas": dist.replicas,
        "devices": list(run.setup.devices),
        "workers": dist.workers,
        "backend": config.backend,
        "strategy": dist.strategy_name,
        "per_replica_batch_size": per_replica,
        "global_batch_size": global_batch,
        "epochs": config.epochs,
        "steps": trainer.step,  # the whole run's, a resumed one's too
        "steps_this_run": history.steps,  # this process's
        "train_examples": data.train_examples,
        "wall_time_s": history.wall_time_s,
        "train_examples_per_sec": history.train_examples_per_sec,
        "final_train_loss": last.get("loss"),
        "final_train_accuracy": last.get("accuracy"),
        "val_loss": val["loss"],
        "val_accuracy": val["accuracy"],
        "test_loss": test["loss"],
        "test_accuracy": test["accuracy"],
        "test_examples": test["examples"],  # counted on the devices: every example once
        "test_eval_time_s": test_eval_time_s,
        "history": history.epochs,
        "learning_rate": trainer.learning_rate(),
        "loss_scale": trainer.loss_scale(),
        "skipped_steps": trainer.skipped_steps(),
        "optimizer_updates": trainer.runner.applied_steps(),  # updates the weights received
        **state_fields(trainer.runner, config.shard),
        "data": {
            "source": data.source,
            "kind": data.kind,
            "description": data.description,
            "input_shape": list(data.input_shape),
            "num_classes": data.num_classes,
            "class_names": list(data.class_names) if data.class_names else None,
        },
        "config": to_dict(config),
    }
    if hasattr(trainer.runner, "input_wait_s") and history.time_s:  # the JAX engine's feed
        summary["input_wait_share"] = trainer.runner.input_wait_s / history.time_s
    return summary


def _say_done(run: Run, history, summary: dict) -> None:
    """The "done" line (and fp16's loss-scale line)."""
    trainer, data = run.trainer, run.data
    rate = history.train_examples_per_sec
    resumed = trainer.step - history.steps
    run.console.print(
        f"done: {trainer.step} steps "
        + (f"({history.steps} in this run, resumed at step {resumed}) " if resumed else "")
        + f"in {history.wall_time_s:.1f} s, "
        + (f"{rate:,.0f} examples/s steady, " if rate else "")
        + ", ".join(
            f"{name} accuracy {summary[f'{name}_accuracy']:.4f}"
            for name in ("val", "test")
            if summary[f"{name}_accuracy"] is not None
        )
        + ("" if data.val is not None or data.test is not None else "no validation or test data")
    )
    if trainer.loss_scale() is not None:
        run.console.print(
            f"fp16 loss scale {trainer.loss_scale():g}, "
            f"{trainer.skipped_steps()} step(s) skipped for non-finite gradients"
        )


def _profile(run: Run, history) -> dict[str, Any]:
    """--profile: where a step's time goes, printed and returned (TensorFlow's)."""
    from mirrorfit.job.profiling import profile_steps

    config = run.config
    _, global_batch = config.batch_sizes(run.dist.replicas)
    with data_errors(run.data):
        report = profile_steps(
            run.trainer,
            run.data.train,
            steady_step_s=_steady_step_s(history, global_batch),
            usage=run.usage.summary(),
            input_source=input_source(run.data, config),
        )
    run.console.print(report.describe())
    return report.as_dict()


def _exports(run: Run) -> dict[str, str]:
    """--save-keras and --export-dir, on the chief: the paths written."""
    config, trainer = run.config, run.trainer
    if not (config.export_dir or config.save_keras):
        return {}
    from mirrorfit.artifacts.finite import refuse_non_finite
    from mirrorfit.artifacts.keras_file import save_keras

    refuse_non_finite(trainer.model, f"global step {trainer.step}", allow=config.allow_nan)
    plain = run.factory()  # a copy outside the strategy: exports load with no strategy
    plain.set_weights(trainer.model.get_weights())
    written = {}
    # The .keras file first: the SavedModel version is what servers pick up, so it commits
    # last, and a signal before it leaves no export.
    if config.save_keras:
        written["keras_file"] = str(
            save_keras(plain, config.save_keras, before_commit=run.guard.check_local)
        )
    if config.export_dir:  # a TensorFlow SavedModel: the TensorFlow engine's runs
        from mirrorfit.artifacts.export import export_saved_model

        path = export_saved_model(
            plain,
            config.export_dir,
            preprocessing=config.export_preprocessing,
            class_names=run.data.class_names,
            before_commit=run.guard.check_local,
        )
        written["export_path"] = str(path)
        run.console.print(f"exported SavedModel version {path}")
    return written


def _steady_step_s(history, global_batch: int) -> float:
    """Seconds per optimizer step in steady state (0 when there was none)."""
    rate = history.train_examples_per_sec
    return global_batch / rate if rate else 0.0
