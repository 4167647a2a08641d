"""The training job: config -> devices -> distribution -> the model -> mirrorfit.fit
(job/keras_job.py: the data, the compile, the loop, the summary and outputs), on the engine
``config.backend`` names (:mod:`mirrorfit.engine.backends`).

``run_training(config)`` is what ``mirrorfit train`` calls; scripts can call it too.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from mirrorfit.config import TrainConfig
from mirrorfit.distribute._cpu_binding import threads_note
from mirrorfit.job.checks import check_run
from mirrorfit.engine import backends
from mirrorfit.errors import ClusterError
from mirrorfit.models.build import model_factory
from mirrorfit.job.preemption import PreemptionGuard
from mirrorfit.job.agreement import check_agreement, data_summary, must_match
from mirrorfit.job.data import load_run_data

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
    """The run's stages: the engine, its devices and distribution, the model (for the data's
    shape where it needs it), then the run through mirrorfit.fit (job/keras_job.py)."""
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
    model, compiled, scope = _model(config, engine, setup, dist, data)
    clock.lap("model")
    from mirrorfit.job import keras_job

    if data is not None and keras_job.built_in(config):
        console.print(f"[bold]mirrorfit[/] {config.model} on {data.description}")
    else:
        console.print(f"[bold]mirrorfit[/] {config.model} (trained through mirrorfit.fit)")
    console.print(f"devices: {setup.describe()}")
    if dist.workers > 1:
        console.print(f"strategy: {dist.describe()}")
    return keras_job.run(
        config,
        console,
        model,
        compiled=compiled,
        scope=scope,
        guard=guard,
        clock=clock,
        returned=data.returned if data is not None else None,  # its function called once
    )


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


def _model(config: TrainConfig, engine, setup, dist, data):
    """``--model``, built here under the strategy (for ``data``'s shape and classes where
    its function needs them and the flags do not say), and mirrorfit.fit set up to train it:
    ``(model, compiled, scope)``, ``scope()`` the strategy's scope to compile it in."""
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
