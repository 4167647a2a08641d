"""The training job: config -> devices -> strategy -> data -> trainer -> summary.

``run_training(config)`` is what ``mirrorfit train`` calls; scripts can call it too.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import keras
import tensorflow as tf
from rich.console import Console

from mirrorfit import _io
from mirrorfit.checkpoint import Checkpointer
from mirrorfit.config import TrainConfig, to_dict
from mirrorfit.distribute.cluster import cluster_for
from mirrorfit.distribute.devices import configure_devices
from mirrorfit.distribute.strategy import Distribution, build_distribution, unreachable
from mirrorfit.engine.progress import EpochProgress
from mirrorfit.engine.trainer import Trainer
from mirrorfit.errors import ClusterError, ConfigError
from mirrorfit.export import check_export_dir, check_keras_path, export_saved_model, save_keras
from mirrorfit.models import model_factory
from mirrorfit.observe import CpuGpuSampler, ScalarWriter, out_of_memory_hint
from mirrorfit.preemption import PreemptionGuard
from mirrorfit.profiling import profile_steps
from mirrorfit.schedules import LinearWarmup, learning_rate
# data_errors: also imported from here by evaluate.py and bench/point.py
from mirrorfit.train_data import (check_model_fits, data_errors, data_flags, input_source,
                                  load_run_data)

_OPTIMIZERS = {"sgd": keras.optimizers.SGD, "adam": keras.optimizers.Adam,
               "adamw": keras.optimizers.AdamW, "rmsprop": keras.optimizers.RMSprop}


def build_optimizer(name: str, lr) -> keras.optimizers.Optimizer:
    """A Keras optimizer by name (sgd, adam, adamw, rmsprop) with learning rate ``lr`` (a float
    or a Keras schedule)."""
    return _OPTIMIZERS[name.lower()](learning_rate=lr)


def _check_outputs(config: TrainConfig) -> None:
    # Fail before any work, so bad input writes nothing.
    for flag, path in (("--metrics-out", config.metrics_out), ("--save-keras", config.save_keras)):
        if path and not Path(path).parent.resolve().is_dir():
            raise ConfigError(f"{flag} {path}: folder {Path(path).parent} does not exist; "
                              "create it first")
    if config.save_keras:
        check_keras_path(config.save_keras)
    if config.export_dir:
        check_export_dir(config.export_dir)


def run_training(config: TrainConfig, *, console: Console | None = None,
                 guard: PreemptionGuard | None = None) -> dict[str, Any]:
    """Train as ``config`` says; print setup, progress and summary; return the summary dict.

    The summary's throughput ``train_examples_per_sec`` is steady state (examples/s, the first
    compiled execution excluded); ``wall_time_s`` is seconds for the whole fit. ``guard``: an
    entered :class:`PreemptionGuard` (the CLI enters one before TensorFlow loads); else one is
    entered here.
    """
    # soft_wrap: in a pipe or a log file rich would break lines at 80 columns.
    console = console or Console(stderr=True, soft_wrap=True)
    # The cluster (TF_CONFIG, SLURM) is plain text: read and checked before TensorFlow starts.
    cluster = cluster_for(config.strategy)
    if cluster is None or cluster.is_chief:
        _check_outputs(config)
    # SIGTERM/SIGINT from here on: stop at the next safe point (after saving a checkpoint, with
    # --checkpoint-dir) and raise Preempted; honoured up to the export's commit.
    if guard is None:
        guard = PreemptionGuard()
        with guard:
            return _run(config, console, guard, cluster)
    return _run(config, console, guard, cluster)


def _run(config: TrainConfig, console: Console, guard: PreemptionGuard,
         cluster) -> dict[str, Any]:
    try:
        return _train(config, console, guard, cluster)
    except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
            tf.errors.CancelledError, tf.errors.AbortedError) as e:
        if cluster is None:
            raise
        # A collective failed: another task died or stopped answering. Name it, in one line.
        gone = unreachable(cluster)
        who = (f"{', '.join(gone)} stopped answering" if gone
               else "a collective with the other workers failed")
        first = (str(getattr(e, "message", e)).strip().splitlines() or [""])[0][:200]
        raise ClusterError(f"{cluster.task_name()}: {who} ({type(e).__name__}: {first}); "
                           "restart the group to resume from the last checkpoint "
                           "(`mirrorfit launch --max-restarts N` does)") from None


def _train(config: TrainConfig, console: Console, guard: PreemptionGuard,
           cluster) -> dict[str, Any]:
    factory = model_factory(config.model)
    if cluster is not None and config.strategy == "parameter-server" \
            and cluster.task_type in ("worker", "ps"):
        from mirrorfit.engine.coordinated import serve_task
        return serve_task(cluster, console=console)  # runs what the chief schedules
    setup = configure_devices(replicas=config.replicas, devices=config.devices,
                              visible_devices=config.visible_devices,
                              memory_growth=config.memory_growth,
                              memory_limit_mb=config.gpu_memory_limit,
                              threads=config.threads_per_worker)
    dist = build_distribution(setup, kind=config.strategy,
                              cross_device_ops=config.cross_device_ops, cluster=cluster,
                              communication=config.communication,
                              collective_timeout_s=config.collective_timeout)
    if not dist.is_chief:  # only the chief talks; the others say only what goes wrong
        console = Console(stderr=True, soft_wrap=True, quiet=True)
    guard.reclaim()  # the strategy may have installed TF's own SIGTERM handler
    guard.watch(None, agree=dist.agree)
    per_replica, global_batch = config.batch_sizes(dist.replicas)
    data = load_run_data(config, global_batch, dist)
    # The model is built for the data: its input shape and classes (mlp/cnn take MNIST's when
    # the data is MNIST, as before).
    factory = model_factory(config.model, input_shape=data.input_shape,
                            num_classes=data.num_classes)
    keras.utils.set_random_seed(config.seed)
    console.print(f"[bold]mirrorfit[/] {config.model} on {data.description}")
    console.print(f"devices: {setup.describe()}")
    accum = f" x {config.accum_steps} accumulation steps" if config.accum_steps > 1 else ""
    console.print(f"strategy: {dist.describe()}, batch: {per_replica} per replica x "
                  f"{dist.replicas} replicas{accum} = {global_batch} global (effective), "
                  f"{config.steps_per_execution} steps per execution")
    steps_per_epoch = data.train.steps_per_epoch
    lr = learning_rate(config.lr, global_batch=global_batch, base_batch=config.base_batch,
                       scaling=config.lr_scaling,
                       warmup_steps=round(config.warmup_epochs * steps_per_epoch))
    console.print(f"precision: {config.precision}, XLA: {'on' if config.xla else 'off'}, "
                  f"learning rate: {_describe_lr(lr)}"
                  + (", rematerialisation on" if config.remat else ""))
    trainer = Trainer(strategy=dist, model=factory,
                      optimizer=build_optimizer(config.optimizer, lr),
                      loss=keras.losses.SparseCategoricalCrossentropy(),
                      global_batch=global_batch, steps_per_execution=config.steps_per_execution,
                      accum_steps=config.accum_steps, precision=config.precision,
                      jit_compile=config.xla, remat=config.remat,
                      on_notice=lambda msg: console.print(f"[yellow]{msg}[/]"))
    callbacks = [lambda e, logs: console.print(_epoch_line(e, config.epochs, logs))]
    if config.logdir:  # every worker reads the metrics (collectives); the chief writes
        board = ScalarWriter(config.logdir if dist.is_chief else None)
        hooks_extra, callbacks = [board.step_hook], callbacks + [board.epoch_callback]
    else:
        hooks_extra = []
    check_model_fits(trainer.model, data, config)
    batches = data.train
    hooks, checkpointer = list(hooks_extra), None
    if config.checkpoint_dir:
        checkpointer = Checkpointer(config.checkpoint_dir, trainer=trainer,
                                    model_spec=config.model, every=config.checkpoint_every,
                                    keep=config.keep_checkpoints, data=batches.order,
                                    flags=data_flags(config, dist, data),
                                    settings=_settings(config),
                                    on_notice=lambda msg: console.print(f"[yellow]{msg}[/]"),
                                    writer=dist.is_chief)
        _restore(checkpointer, config, console, dist, batches.steps_per_epoch)
        hooks.append(checkpointer.step_hook)
        callbacks.append(checkpointer.epoch_callback)
    guard.watch(trainer, checkpointer, agree=dist.agree)
    hooks.append(guard.hook)
    callbacks.append(guard.epoch_callback)
    usage = CpuGpuSampler() if config.profile else contextlib.nullcontext()
    guard.check()  # a signal while setting up: stop before the first step
    with usage, out_of_memory_hint(per_replica), data_errors(data):
        history = trainer.fit(
            batches, epochs=config.epochs, validation=data.val, hooks=hooks,
            progress=EpochProgress(console=console, enabled=config.progress),
            callbacks=callbacks)
    guard.check()  # a signal during the last validation or checkpoint
    return _finish(config, console, history, trainer=trainer, data=data, batches=batches,
                   setup=setup, dist=dist, factory=factory, usage=usage, guard=guard)


def _finish(config: TrainConfig, console: Console, history, *, trainer, data, batches, setup,
            dist: Distribution, factory, usage, guard: PreemptionGuard) -> dict[str, Any]:
    """Test evaluation, summary, profile and exports: everything after the training loop.
    ``guard`` stops it before the exports commit if a signal arrives. Every worker evaluates
    (the evaluation's collectives need them all); only the chief writes."""
    per_replica, global_batch = config.batch_sizes(dist.replicas)
    eval_batch = config.eval_batch_size or global_batch
    t0 = time.perf_counter()
    none = {"loss": None, "accuracy": None, "examples": 0}
    with out_of_memory_hint(per_replica), data_errors(data):
        test = none if data.test is None else trainer.evaluate(data.test, batch_size=eval_batch)
        if history.epochs:
            last = history.epochs[-1]
            val = {"loss": last.get("val_loss"), "accuracy": last.get("val_accuracy")}
        else:  # resumed a finished run: nothing trained, but still report where it stands
            console.print(f"nothing to train: {trainer.epoch} of {config.epochs} epochs "
                          "already done")
            last = {}
            val = none if data.val is None else trainer.evaluate(data.val, batch_size=eval_batch)
    summary = {
        "model": config.model, "precision": config.precision, "xla": trainer.jit_compile,
        "accum_steps": config.accum_steps, "replicas": dist.replicas,
        "devices": list(setup.devices), "workers": dist.workers,
        "strategy": type(dist.strategy).__name__, "per_replica_batch_size": per_replica,
        "global_batch_size": global_batch, "epochs": config.epochs, "steps": history.steps,
        "train_examples": data.train_examples, "wall_time_s": history.wall_time_s,
        "train_examples_per_sec": history.train_examples_per_sec,
        "final_train_loss": last.get("loss"), "final_train_accuracy": last.get("accuracy"),
        "val_loss": val["loss"], "val_accuracy": val["accuracy"],
        "test_loss": test["loss"], "test_accuracy": test["accuracy"],
        "test_examples": test["examples"],  # counted on the devices: every example once
        "test_eval_time_s": time.perf_counter() - t0, "history": history.epochs,
        "learning_rate": trainer.learning_rate(), "loss_scale": trainer.loss_scale(),
        "skipped_steps": trainer.skipped_steps(),
        "optimizer_updates": trainer.runner.applied_steps(),  # updates the weights received
        "data": {"source": data.source, "kind": data.kind, "description": data.description,
                 "input_shape": list(data.input_shape), "num_classes": data.num_classes,
                 "class_names": list(data.class_names) if data.class_names else None},
        "config": to_dict(config),
    }
    rate = history.train_examples_per_sec
    console.print(f"done: {history.steps} steps in {history.wall_time_s:.1f} s, "
                  + (f"{rate:,.0f} examples/s steady, " if rate else "")
                  + ", ".join(f"{name} accuracy {summary[f'{name}_accuracy']:.4f}"
                              for name in ("val", "test")
                              if summary[f"{name}_accuracy"] is not None)
                  + ("" if data.val is not None or data.test is not None
                     else "no validation or test data"))
    if trainer.loss_scale() is not None:
        console.print(f"fp16 loss scale {trainer.loss_scale():g}, "
                      f"{trainer.skipped_steps()} step(s) skipped for non-finite gradients")
    if config.profile:
        with data_errors(data):
            report = profile_steps(trainer, batches,
                                   steady_step_s=_steady_step_s(history, global_batch),
                                   usage=usage.summary(),
                                   input_source=input_source(data, config))
        summary["profile"] = report.as_dict()
        console.print(report.describe())
    guard.check()
    if not dist.is_chief:
        return summary
    if config.export_dir or config.save_keras:
        plain = factory()  # a copy outside the strategy: exports load with no strategy
        plain.set_weights(trainer.model.get_weights())
        # The .keras file first: the SavedModel version is what servers pick up, so it commits
        # last, and a signal before it leaves no export.
        if config.save_keras:
            summary["keras_file"] = str(save_keras(plain, config.save_keras,
                                                   before_commit=guard.check_local))
        if config.export_dir:
            path = export_saved_model(plain, config.export_dir,
                                      preprocessing=config.export_preprocessing,
                                      before_commit=guard.check_local)
            summary["export_path"] = str(path)
            console.print(f"exported SavedModel version {path}")
    if config.metrics_out:
        _io.write_json_atomic(config.metrics_out, summary)
    return summary



def _settings(config: TrainConfig) -> dict[str, Any]:
    """The flags that fix what the checkpointed state means: another model, optimizer,
    learning-rate schedule or precision would not continue the same run (and Keras would keep
    the old rate: the learning rate is an optimizer variable), so a resume with any of them
    changed is refused by name. Free to change: --epochs, --steps-per-execution, --xla,
    --remat, --checkpoint-every and the outputs."""
    linear = config.lr_scaling == "linear"
    return {"--model": config.model, "--optimizer": config.optimizer.lower(), "--lr": config.lr,
            "--lr-scaling": config.lr_scaling,
            "--base-batch": config.base_batch if linear else None,
            "--warmup-epochs": config.warmup_epochs, "--precision": config.precision}


def _restore(checkpointer: Checkpointer, config: TrainConfig, console: Console,
             dist: Distribution, steps_per_epoch: int) -> None:
    checkpointer.clean_partial()  # the chief's; the other workers only read
    if config.fresh:
        aside = checkpointer.discard()
        if aside:
            console.print(f"--fresh: moved the existing checkpoints to {aside}")
    dist.agree(False)  # a barrier: nobody reads before the chief has cleaned up
    restored = checkpointer.restore_latest()
    step = restored.step if restored else 0
    if not dist.all_equal(step):
        raise ConfigError(f"{dist.task} restored step {step}, another worker a different one; "
                          "give every worker the same --checkpoint-dir, on storage they all "
                          "see")
    if restored:  # saved at an epoch's last step: that epoch is done (as Trainer.fit counts)
        done, at = ((restored.epoch + 1, 0) if restored.step_in_epoch == steps_per_epoch
                    else (restored.epoch, restored.step_in_epoch))
        console.print(f"resuming from {restored.path}: {done} epoch(s) done, continuing epoch "
                      f"{done + 1} at step {at} (global step {restored.step})")


def _steady_step_s(history, global_batch: int) -> float:
    """Seconds per optimizer step in steady state (0 when there was none)."""
    rate = history.train_examples_per_sec
    return global_batch / rate if rate else 0.0


def _describe_lr(lr) -> str:
    if isinstance(lr, LinearWarmup):
        return f"{lr.initial_lr:g} -> {lr.target_lr:g} over {lr.warmup_steps} warm-up steps"
    return f"{lr:g}"


def _epoch_line(epoch: int, epochs: int, logs: dict[str, float]) -> str:
    return (f"epoch {epoch}/{epochs}: loss {logs['loss']:.4f} accuracy {logs['accuracy']:.4f} "
            + (f"val_loss {logs['val_loss']:.4f} val_accuracy {logs['val_accuracy']:.4f} "
               if "val_loss" in logs else "")
            + f"{logs['examples_per_sec']:,.0f} examples/s"
            + (f" loss scale {logs['loss_scale']:g}, {logs['skipped_steps']:.0f} skipped"
               if "loss_scale" in logs else ""))
