"""The training job: config -> devices -> distribution -> data -> trainer -> summary, on the
engine ``config.backend`` names (:mod:`mirrorfit.engine.backends`).

``run_training(config)`` is what ``mirrorfit train`` calls; scripts can call it too. The data
side of the run is in job/data.py, everything after the training loop in job/finish.py.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rich.console import Console

from mirrorfit.artifacts.checkpoint import Checkpointer
from mirrorfit.artifacts.checkpoint_meta import settings_of
from mirrorfit.config import TrainConfig
from mirrorfit.distribute._cpu_binding import threads_note
from mirrorfit.job.checks import check_run
from mirrorfit.engine import backends
from mirrorfit.engine.progress import EpochProgress
from mirrorfit.engine.controller import Trainer
from mirrorfit.errors import ClusterError
from mirrorfit.models.build import model_factory
from mirrorfit.job.observe import CpuGpuSampler, ScalarWriter, out_of_memory_hint
from mirrorfit.job.preemption import PreemptionGuard
from mirrorfit.models.schedules import LinearWarmup, build_optimizer, learning_rate
from mirrorfit.job.agreement import check_agreement, data_summary, must_match
from mirrorfit.job.divergence import DivergenceGuard
from mirrorfit.data.file_errors import data_errors
from mirrorfit.job.data import check_model_fits, data_flags, load_run_data
from mirrorfit.job.finish import Run, finish, state_line

_UNCHECKED = object()  # run_training's cluster: not given, so checked here


def run_training(
    config: TrainConfig,
    *,
    console: Console | None = None,
    guard: PreemptionGuard | None = None,
    cluster=_UNCHECKED,
    timings: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Train as ``config`` says; print setup, progress and summary; return the summary dict
    (``train_examples_per_sec``: steady examples/s, first execution excluded; ``wall_time_s``: the
    whole fit, seconds). ``guard``: an entered :class:`PreemptionGuard` (the CLI's), else one is
    entered here; ``cluster``: :func:`mirrorfit.job.checks.check_run`'s, else checked here;
    ``timings``: seconds of what came before (start-up, the framework's import), in ``timings_s``.
    """
    # soft_wrap: in a pipe or a log file rich would break lines at 80 columns.
    console = console or Console(stderr=True, soft_wrap=True)
    if cluster is _UNCHECKED:  # a Python caller: the CLI checked before the framework loaded
        cluster = check_run(config)
    # SIGTERM/SIGINT from here on: stop at the next safe point (after saving a checkpoint, with
    # --checkpoint-dir) and raise Preempted; honoured up to the export's commit.
    if guard is None:
        guard = PreemptionGuard()
        with guard:
            return _run(config, console, guard, cluster, _Clock(timings))
    return _run(config, console, guard, cluster, _Clock(timings))


class _Clock:
    """Seconds per phase of the run (``lap(name)``: since the last lap), for the summary."""

    def __init__(self, before: dict[str, float] | None) -> None:
        self.timings = dict(before or {})
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        # a phase met twice (the data: opened for a built-in model's shape, then read for
        # mirrorfit.fit) counts both times
        self.timings[name] = round(self.timings.get(name, 0.0) + now - self._last, 3)
        self._last = now


def _run(
    config: TrainConfig, console: Console, guard: PreemptionGuard, cluster, clock: _Clock
) -> dict[str, Any]:
    try:
        return _train(config, console, guard, cluster, clock)
    except Exception as e:
        failed = [engine for engine in backends.loaded() if engine.peer_failure(e)]
        if cluster is None or not failed:
            raise
        # A collective failed: another task died or stopped answering. Name it, in one line.
        gone = failed[0].stopped_answering(cluster)
        who = (
            f"{', '.join(gone)} stopped answering"
            if gone
            else "a collective with the other workers failed"
        )
        first = (str(getattr(e, "message", e)).strip().splitlines() or [""])[0][:200]
        raise ClusterError(
            f"{cluster.task_name()}: {who} ({type(e).__name__}: {first}); "
            "restart the group to resume from the last checkpoint "
            "(`mirrorfit launch --max-restarts N` does)"
        ) from None


def _train(
    config: TrainConfig, console: Console, guard: PreemptionGuard, cluster, clock: _Clock
) -> dict[str, Any]:
    """The run's stages: the engine, its devices and distribution, the data, the model and
    trainer, the loop, then :func:`finish`."""
    engine = backends.load(config.backend)  # the framework loads here
    clock.lap("engine")
    model_factory(config.model)  # a --model that does not load fails before the devices
    if (
        cluster is not None
        and config.strategy == "parameter-server"
        and cluster.task_type in ("worker", "ps")
    ):
        from mirrorfit.engine.tensorflow.parameter_server import serve_task

        guard.hand_over()  # serve_task handles its signals (it serves until the chief ends)
        return serve_task(cluster, console=console)  # runs what the chief schedules
    setup, dist = _devices(config, engine, cluster, console, guard)
    if not dist.is_chief:  # only the chief talks; the others say only what goes wrong
        console = Console(stderr=True, soft_wrap=True, quiet=True)
    clock.lap("devices")
    data = None
    if _built_for_the_data(config):  # a --model function that takes the data's shape
        data = _run_data(config, dist, clock)
    compiled = _compiled_user_model(config, engine, setup, dist, data)
    if compiled is not None:  # the Keras user's way: trained as compiled (job/keras_job.py)
        from mirrorfit.job import keras_job

        clock.lap("model")

        if data is not None and keras_job.built_in(config):  # as the earlier loop said it
            console.print(f"[bold]mirrorfit[/] {config.model} on {data.description}")
        else:
            console.print(f"[bold]mirrorfit[/] {config.model} (trained through mirrorfit.fit)")
        console.print(f"devices: {setup.describe()}")
        if dist.workers > 1:
            console.print(f"strategy: {dist.describe()}")
        model, was_compiled, scope = compiled
        return keras_job.run(
            config,
            console,
            model,
            compiled=was_compiled,
            scope=scope,
            guard=guard,
            clock=clock,
            returned=data.returned if data is not None else None,  # its function called once
        )
    if data is None:
        data = _run_data(config, dist, clock)
    # The model is built for the data: its input shape and classes (mlp/cnn take MNIST's when
    # the data is MNIST, as before).
    factory = model_factory(
        config.model, input_shape=data.input_shape, num_classes=data.num_classes
    )
    engine.seed(config.seed)
    trainer = _trainer(config, engine, setup, dist, data, factory, console)
    usage = CpuGpuSampler() if config.profile else contextlib.nullcontext()
    run = Run(
        config=config,
        console=console,
        trainer=trainer,
        data=data,
        setup=setup,
        dist=dist,
        factory=factory,
        guard=guard,
        usage=usage,
        clock=clock,
    )
    return finish(run, _fit(run))


def _run_data(config: TrainConfig, dist, clock: _Clock):
    """The run's data, checked to be every worker's."""
    _, global_batch = config.batch_sizes(dist.replicas)
    data = load_run_data(config, global_batch, dist)
    check_agreement(data_summary(data), dist)
    clock.lap("data")
    return data


def _built_for_the_data(config: TrainConfig) -> bool:
    """Whether ``--model`` is a function with a required ``input_shape``/``num_classes`` that
    the flags do not give: it is built for the data's, so the data open first."""
    from mirrorfit.models.build import needs_data_shape

    return ":" not in config.model or needs_data_shape(
        config.model, config.input_shape, config.num_classes
    )


def _devices(config: TrainConfig, engine, cluster, console: Console, guard: PreemptionGuard):
    """The devices and the distribution over them, (DeviceSetup, distribution); every worker
    then agrees on the settings that must match (a collective)."""
    # A multi-worker task joins its job here where the engine does it with its devices (JAX's
    # jax.distributed, before JAX starts them); TensorFlow's strategy joins it below.
    joining = (
        {"cluster": cluster, "collective_timeout_s": config.collective_timeout}
        if cluster is not None
        else {}
    )
    setup = engine.configure_devices(
        replicas=config.replicas,
        devices=config.devices,
        visible_devices=config.visible_devices,
        memory_growth=config.memory_growth,
        memory_limit_mb=config.gpu_memory_limit,
        threads=config.threads_per_worker,
        keep_freed_memory=True,  # a training process: _host_memory
        **joining,
    )
    note = threads_note(config.threads_per_worker)
    if note:  # every worker says it: bound workers' shares of the cores may differ
        console.print(f"[yellow]{note}[/]")
    dist = engine.build_distribution(
        setup,
        kind=config.strategy,
        cross_device_ops=config.cross_device_ops,
        cluster=cluster,
        communication=config.communication,
        collective_timeout_s=config.collective_timeout,
        shard=config.shard,
        # a 2-D mesh where asked for (JAX: the config refuses it elsewhere)
        **({"model_parallel": config.model_parallel} if config.model_parallel > 1 else {}),
    )
    guard.reclaim()  # the strategy may have installed TF's own SIGTERM handler
    guard.watch(None, agree=dist.agree)
    check_agreement(must_match(config, dist.replicas, dist.local_replicas), dist)  # collective
    return setup, dist


def _trainer(config: TrainConfig, engine, setup, dist, data, factory, console: Console):
    """The Trainer for the built-in loop, the start screen printed on the way."""
    per_replica, global_batch = config.batch_sizes(dist.replicas)
    console.print(f"[bold]mirrorfit[/] {config.model} on {data.description}")
    console.print(f"devices: {setup.describe()}")
    accum = f" x {config.accum_steps} accumulation steps" if config.accum_steps > 1 else ""
    console.print(
        f"strategy: {dist.describe()}, batch: {per_replica} per replica x "
        f"{dist.replicas} replicas{accum} = {global_batch} global (effective), "
        f"{config.steps_per_execution} steps per execution"
    )
    lr = learning_rate(
        config.lr,
        global_batch=global_batch,
        base_batch=config.base_batch,
        scaling=config.lr_scaling,
        warmup_steps=round(config.warmup_epochs * data.train.steps_per_epoch),
    )
    xla = (
        "on (every step, JAX)"
        if engine.CAPABILITIES.compiles_every_step
        else "on"
        if config.xla
        else "off"
    )
    console.print(
        f"precision: {config.precision}, XLA: {xla}, "
        f"learning rate: {_describe_lr(lr)}" + (", rematerialisation on" if config.remat else "")
    )
    import keras

    trainer = Trainer(
        strategy=dist,
        model=factory,
        optimizer=build_optimizer(config.optimizer, lr),
        loss=keras.losses.SparseCategoricalCrossentropy(),
        global_batch=global_batch,
        steps_per_execution=config.steps_per_execution,
        accum_steps=config.accum_steps,
        precision=config.precision,
        jit_compile=config.xla,
        remat=config.remat,
        on_notice=lambda msg: console.print(f"[yellow]{msg}[/]"),
    )
    check_model_fits(trainer.model, data, config)
    console.print(state_line(trainer.runner))
    return trainer


def _checkpointer(run: Run) -> Checkpointer | None:
    """--checkpoint-dir's checkpointer, the run resumed from it; None without one."""
    config, trainer, data, dist = run.config, run.trainer, run.data, run.dist
    if not config.checkpoint_dir:
        return None
    checkpointer = Checkpointer(
        config.checkpoint_dir,
        trainer=trainer,
        model_spec=config.model,
        every=config.checkpoint_every,
        keep=config.keep_checkpoints,
        data=data.train.order,
        flags=data_flags(config, dist, data),
        settings=settings_of(config),
        on_notice=lambda msg: run.console.print(f"[yellow]{msg}[/]"),
        writer=dist.is_chief,
        class_names=data.class_names,
        allow_nan=config.allow_nan,
    )
    trainer.resume(
        checkpointer,
        steps_per_epoch=data.train.steps_per_epoch,
        fresh=config.fresh,
        say=run.console.print,
    )
    return checkpointer


def _fit(run: Run):
    """The loop, with its step hooks and epoch callbacks, in their order: the epoch's line,
    the divergence check, TensorBoard's scalars, the checkpointer, the signal guard."""
    config, console, trainer, guard = run.config, run.console, run.trainer, run.guard
    callbacks = [lambda e, logs: console.print(_epoch_line(e, config.epochs, logs))]
    hooks: list = []
    board = ScalarWriter(config.logdir if run.dist.is_chief else None) if config.logdir else None
    checkpointer = _checkpointer(run)
    if not config.allow_nan:  # first: a NaN step is neither checkpointed nor written out
        diverged = DivergenceGuard(trainer, checkpoints=checkpointer)
        hooks.append(diverged.hook)
        if checkpointer is None:  # else its epoch-end save checks the weights, as often
            callbacks.append(diverged.epoch_callback)
    if board is not None:  # every worker reads the metrics (collectives); the chief writes
        hooks.append(board.step_hook)
        callbacks.append(board.epoch_callback)
    if checkpointer is not None:
        hooks.append(checkpointer.step_hook)  # before the guard's: a signal saves this step
        callbacks.append(checkpointer.epoch_callback)
    guard.reclaim()  # user code (a --data or --model function, a library) may have taken them
    guard.watch(trainer, checkpointer, agree=run.dist.agree)
    hooks.append(guard.hook)
    callbacks.append(guard.epoch_callback)
    guard.check()  # a signal while setting up: stop before the first step
    run.clock.lap("model")
    per_replica, _ = config.batch_sizes(run.dist.replicas)
    try:
        with run.usage, out_of_memory_hint(per_replica), data_errors(run.data):
            history = trainer.fit(
                run.data.train,
                epochs=config.epochs,
                validation=run.data.val,
                hooks=hooks,
                progress=EpochProgress(console=console, enabled=config.progress),
                callbacks=callbacks,
            )
    finally:  # its last steps' scalars are written, also when a signal stops the run
        if board is not None:
            board.close()
    if checkpointer is not None:
        checkpointer.wait()  # the last save, committed (it may write in the background)
    guard.check()  # a signal during the last validation or checkpoint
    run.clock.lap("fit")
    run.clock.timings.update(
        first_execution=round(history.first_execution_s, 3),
        steady_steps=round(history.steady_time_s, 3),
        validation=round(history.validation_s, 3),
    )
    return history


def _compiled_user_model(config: TrainConfig, engine, setup, dist, data):
    """A ``--model package.module:function`` that returns a compiled model (or is given
    ``--loss``), built here under the strategy (for ``data``'s shape and classes where the
    function needs them and the flags do not say): ``(model, compiled, scope)``, ``scope()``
    the strategy's scope to compile it in; None for the default loop (a built-in model, or an
    uncompiled one without ``--loss``)."""
    from mirrorfit.job import keras_job
    from mirrorfit.models.precision import as_precision

    engine.seed(config.seed)
    factory = model_factory(
        config.model,
        input_shape=data.input_shape if data is not None else config.input_shape,
        num_classes=data.num_classes if data is not None else config.num_classes,
    )
    strategy = getattr(dist, "strategy", None)

    def scope():  # a fresh context each time: a strategy's scope() is entered once
        return strategy.scope() if strategy is not None else engine.creating_variables(dist)

    with scope(), as_precision(config.precision).building():
        model = factory()
    if not keras_job.wanted(config, model):
        keras_job.check_default_loop(config, model)
        return None
    keras_job.check(config, engine, model)
    compiled = bool(getattr(model, "compiled", False))
    from mirrorfit.fitting.setup import Setup, use

    scheduled = dist.kind == "parameter-server"
    # what mirrorfit.fit runs on: TensorFlow's strategy (the model was built under it), JAX's mesh
    use(
        Setup(
            backend=config.backend,
            devices=setup,
            placement=strategy or dist,
            precision=config.precision,
            # several workers in step; parameter servers' chief runs the loop alone
            distribution=dist if dist.workers > 1 and not scheduled else None,
            sync_batchnorm=config.sync_batchnorm,
            scheduled_on=dist.workers if scheduled else 0,
        )
    )
    return model, compiled, scope


def _describe_lr(lr) -> str:
    if isinstance(lr, LinearWarmup):
        return f"{lr.initial_lr:g} -> {lr.target_lr:g} over {lr.warmup_steps} warm-up steps"
    return f"{lr:g}"


def _epoch_line(epoch: int, epochs: int, logs: dict[str, float]) -> str:
    return (
        f"epoch {epoch}/{epochs}: loss {logs['loss']:.4f} accuracy {logs['accuracy']:.4f} "
        + (
            f"val_loss {logs['val_loss']:.4f} val_accuracy {logs['val_accuracy']:.4f} "
            if "val_loss" in logs
            else ""
        )
        + f"{logs['examples_per_sec']:,.0f} examples/s"
        + (
            f" loss scale {logs['loss_scale']:g}, {logs['skipped_steps']:.0f} skipped"
            if "loss_scale" in logs
            else ""
        )
    )
