"""``mirrorfit.setup``: the engine, devices and precision of a Keras script, chosen once before its
model is built. On TensorFlow the strategy becomes the process's default, so the model built
next is mirrored; on JAX only :func:`mirrorfit.fit` uses the mesh. ``strategy="multi-worker"``
joins the job ``TF_CONFIG`` or SLURM describe (docs/keras-script.md#several-workers).
(why: docs/architecture.md#the-scripts-setup)
"""

from __future__ import annotations

import importlib
import numbers
from dataclasses import dataclass, field

from mirrorfit.engine import backends
from mirrorfit.engine.device_setup import DeviceSetup
from mirrorfit.errors import ConfigError, FitError
from mirrorfit.models.precision import POLICIES


@dataclass(frozen=True)
class Setup:
    """What :func:`setup` chose: ``backend``, the device setup, the engine's placement
    (a ``tf.distribute.Strategy`` or a JAX ``Placement``), the precision's name and the
    ``distribution`` (TensorFlow's ``Distribution`` or the JAX ``Placement``: the workers, this
    one's place among them, and their small collectives; None: this process alone), and the
    workers a parameter-server chief schedules its steps on (``scheduled_on``; 0: none)."""

    backend: str
    devices: DeviceSetup
    placement: object = field(repr=False)
    precision: str = "fp32"
    distribution: object = field(default=None, repr=False)
    sync_batchnorm: bool = False
    scheduled_on: int = 0

    @property
    def replicas(self) -> int:
        """Replicas in sync, over every worker."""
        return getattr(self.distribution, "replicas", self.devices.replicas)

    @property
    def workers(self) -> int:
        return self.scheduled_on or getattr(self.distribution, "workers", 1)

    @property
    def is_chief(self) -> bool:
        """Whether this process writes (Keras's writing callbacks run here only)."""
        return getattr(self.distribution, "is_chief", True)


_current: list[Setup] = []  # the last setup() of this process (what fit uses by default)


def setup(
    *,
    backend: str | None = None,
    replicas: int | None = None,
    devices: tuple[str, ...] = (),
    precision: str = "fp32",
    shard: str = "none",
    strategy: str = "auto",
    sync_batchnorm: bool = False,
    model_parallel: int = 1,
    verbose: bool = False,
) -> Setup:
    """Choose the engine (``backend``: ``"tensorflow"``/``"jax"``; default ``$KERAS_BACKEND``, else
    TensorFlow), devices (all GPUs, ``devices`` by name, the first ``replicas``; without GPUs
    ``replicas`` logical CPUs), precision (``"fp32"``, ``"bf16"``, ``"fp16"``), ``shard`` (JAX:
    ``"none"``, ``"optimizer"``: ZeRO-1, ``"all"``: FSDP) and ``strategy`` (``"auto"``;
    ``"multi-worker"``: ``replicas`` counts this worker's) and ``sync_batchnorm`` (every
    BatchNormalization layer's batch statistics over the global batch, as on one device, not
    over each replica's share) and ``model_parallel`` (JAX: the devices each weight is split
    over, a 2-D mesh of ``replicas / model_parallel`` data groups). Once, before Keras builds
    a model.
    """
    if _current:
        raise FitError(
            "mirrorfit.setup() was already called in this process; devices can "
            "be chosen only once, before the framework starts"
        )
    if not isinstance(precision, str) or precision not in POLICIES:
        raise FitError(f"precision={precision!r}: choose one of {', '.join(POLICIES)}")
    if replicas is not None:
        import operator

        given = replicas
        try:
            if isinstance(replicas, bool):
                raise TypeError
            replicas = operator.index(replicas)  # NumPy's integers too, as fit takes them
        except TypeError:
            replicas = 0
        if replicas < 1:
            raise FitError(f"replicas={given!r}: give a whole number of at least 1")
    if not isinstance(sync_batchnorm, bool):
        raise FitError(f"sync_batchnorm={sync_batchnorm!r}: give True or False")
    if isinstance(devices, str) or not all(isinstance(d, str) for d in devices):
        raise FitError(
            f"devices={devices!r}: give a list of device names, e.g. devices=['/gpu:0', "
            "'/gpu:1'] (mirrorfit.list_devices() names them)"
        )
    backend = _backend(backend)
    if isinstance(model_parallel, numbers.Integral) and not isinstance(model_parallel, bool):
        model_parallel = int(model_parallel)  # NumPy's integers too
    if (
        isinstance(model_parallel, bool)
        or not isinstance(model_parallel, int)
        or model_parallel < 1
    ):
        raise FitError(
            f"model_parallel={model_parallel!r}: give the devices each weight is split over, a "
            "whole number of at least 1 (1: every device holds whole weights)"
        )
    if model_parallel > 1 and not backends.capabilities(backend).splits_state:
        raise FitError(
            f"model_parallel={model_parallel} splits the weights on the JAX engine only; "
            "use backend='jax', or model_parallel=1"
        )
    if not isinstance(shard, str) or shard not in backends.SHARD_MODES:
        raise FitError(
            f"shard={shard!r}: choose 'none' (every device holds the whole state), "
            "'optimizer' (ZeRO-1: the optimizer state split over the devices) or "
            "'all' (FSDP: the weights too)"
        )
    if shard != "none" and not backends.capabilities(backend).splits_state:
        raise FitError(
            f"shard={shard!r} splits the training state on the JAX engine only; "
            "use backend='jax', or shard='none'"
        )
    cluster = _cluster(strategy)
    try:
        backends.prepare(backend, verbose=verbose)
    except ConfigError:  # Keras was imported with the other backend: this API's words
        import keras

        loaded = keras.backend.backend()
        raise FitError(
            f"backend={backend!r}, but Keras was already imported with the {loaded} backend; "
            f"pass backend={loaded!r}, or call mirrorfit.setup(backend={backend!r}) before "
            "importing keras"
        ) from None
    try:
        grid = {"model_parallel": model_parallel} if model_parallel > 1 else {}
        made = importlib.import_module(backends.ENGINES[backend]).keras_setup(
            replicas, tuple(devices), shard=shard, cluster=cluster, **grid
        )
    except ConfigError as e:
        if "can only be configured before" not in str(e):
            raise FitError(str(e)) from None
        raise FitError(
            f"mirrorfit.setup() came after {backend} started (a model built, or an array "
            "made, first); call it first in the script, before building the model"
        ) from None
    import keras

    keras.config.set_dtype_policy(POLICIES[precision])
    _current.append(
        Setup(
            backend=backend,
            devices=made[0],
            placement=made[1],
            precision=precision,
            distribution=made[2] if cluster is not None else None,
            sync_batchnorm=sync_batchnorm,
        )
    )
    return _current[-1]


def _backend(value) -> str:
    """``backend`` (else $KERAS_BACKEND, else TensorFlow) as one of the engines; FitError in
    this API's words (the CLI's say --backend)."""
    import os

    choices = " or ".join(repr(b) for b in backends.BACKENDS)
    if value is None and os.environ.get("KERAS_BACKEND", backends.DEFAULT) not in backends.BACKENDS:
        raise FitError(
            f"KERAS_BACKEND={os.environ['KERAS_BACKEND']!r}: mirrorfit trains on {choices}; "
            "pass backend='jax' (or 'tensorflow'), or set KERAS_BACKEND to one of them"
        )
    if value is not None and (not isinstance(value, str) or value not in backends.BACKENDS):
        raise FitError(f"backend={value!r}: mirrorfit trains on {choices}; e.g. backend='jax'")
    return backends.resolve(value)


# distribute.cluster.check_strategy's refusals in this API's words (the CLI's say --strategy):
# the same str.format fields as its CLI_WORDS.
_STRATEGY_WORDS = {
    "alone": "{source} describes a cluster ({cluster}) but strategy='auto' trains alone; "
    "pass strategy='multi-worker', or unset TF_CONFIG for a one-process run",
    "missing": "strategy='multi-worker' needs a cluster: start the script with `mirrorfit "
    "launch --workers N -- python SCRIPT`, set TF_CONFIG, or run it under SLURM's srun",
    "mismatch": "strategy='multi-worker', but the cluster ({cluster}) has parameter servers, "
    "which mirrorfit.fit does not train with; describe workers only",
}


def _cluster(strategy: str):
    """The job this process joins (``strategy="multi-worker"``), else None; FitError where
    the environment disagrees (a cluster in TF_CONFIG with ``"auto"``: every task would train
    its own copy)."""
    from mirrorfit.distribute.cluster import check_strategy, resolve_cluster
    from mirrorfit.errors import ConfigError

    if not isinstance(strategy, str) or strategy not in ("auto", "multi-worker"):
        raise FitError(
            f"strategy={strategy!r}: choose 'auto' (this process's devices) or "
            "'multi-worker' (the job TF_CONFIG or SLURM describe)"
        )
    try:
        cluster = resolve_cluster()
    except ConfigError as e:
        raise FitError(str(e)) from None
    return check_strategy(strategy, cluster, _STRATEGY_WORDS, error=FitError)


def use(chosen: Setup) -> None:
    """Make ``chosen`` (devices the caller set up itself: ``mirrorfit train``) the one
    :func:`mirrorfit.fit` uses."""
    _current.append(chosen)


def current() -> Setup | None:
    """The last :func:`setup` of this process, or None."""
    return _current[-1] if _current else None
