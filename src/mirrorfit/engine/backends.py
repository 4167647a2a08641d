"""The backend seam: which engine runs a job (``tensorflow`` or ``jax``; ``--backend``, the TOML
key ``backend``, else ``KERAS_BACKEND``, else ``tensorflow``), chosen before Keras loads, and
what it needs before its framework starts: :func:`prepare` sets ``KERAS_BACKEND`` and quiets
the C++ start-up log; :func:`check_settings` refuses, in one line, settings the engine lacks.
Plain Python, imported before any framework. (why: docs/architecture.md#the-seams)
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from types import ModuleType
from typing import Callable

from mirrorfit._frameworks import (
    install_hint,
    installed,
    tensorflow_start_filtered,
)
from mirrorfit.engine.contract import Capabilities
from mirrorfit.errors import ConfigError

BACKENDS = ("tensorflow", "jax")
# Each engine's package (what engine/contract.py types); a new engine is a folder and a line.
ENGINES = {"tensorflow": "mirrorfit.engine.tensorflow", "jax": "mirrorfit.engine.jax"}
# How a distribution splits the input (its ``input_split``), whichever engine runs it:
# one process reads whole global batches; each of several workers reads its contiguous share
# of every global batch; parameter-server workers read their own streams.
GLOBAL_BATCH, WORKER_SHARE, COORDINATOR = "global-batch", "worker-share", "coordinator"
DEFAULT = "tensorflow"
# What of the training state --shard splits over the devices (the JAX engine's sharding module)
SHARD_MODES = ("none", "optimizer", "all")
# Why a strategy needs what an engine that lacks it does not have (the refusal's words).
STRATEGY_NEEDS = {
    "central-storage": "keeps variables on one device for TensorFlow's replicas",
    "parameter-server": "needs TensorFlow's ParameterServerStrategy",
}


def capabilities(backend: str) -> Capabilities:
    """What ``backend``'s engine declares it can do (its package's ``CAPABILITIES``; plain
    Python, no framework loaded)."""
    return importlib.import_module(ENGINES[backend]).CAPABILITIES


def _engines_that(can: Callable[[Capabilities], bool]) -> str:
    """The engines whose capabilities ``can``, as a flag: ``--backend jax``."""
    return " or ".join(f"--backend {b}" for b in BACKENDS if can(capabilities(b)))


def resolve(value: str | None) -> str:
    """The backend a job runs on: ``value`` (a flag or TOML key), else ``$KERAS_BACKEND``,
    else ``tensorflow``, whatever is installed (the same command must not resume a TensorFlow
    run on JAX because a machine lacks TensorFlow); ConfigError naming where an unknown one
    came from."""
    where = "--backend"
    if value is None:
        value, where = os.environ.get("KERAS_BACKEND") or DEFAULT, "KERAS_BACKEND"
    if value not in BACKENDS:
        raise ConfigError(
            f"{where} {value!r}: mirrorfit trains on {' or '.join(BACKENDS)}; e.g. --backend jax"
        )
    return value


def split_batch(global_batch: int, replicas: int, accum_steps: int = 1) -> int:
    """Examples per replica per micro-batch for ``global_batch`` examples per optimizer step over
    ``replicas`` replicas and ``accum_steps`` micro-batches; ConfigError naming a multiple that
    works when it does not divide (every engine, the configuration and bench ask here)."""
    n = replicas * accum_steps
    if global_batch % n:
        raise ConfigError(
            f"global batch size {global_batch} is not divisible by {replicas} replicas x "
            f"{accum_steps} accumulation steps; use a multiple of {n} (e.g. "
            f"{max(n, global_batch // n * n)})"
        )
    return global_batch // n


def check_settings(
    backend: str,
    *,
    strategy: str = "auto",
    cross_device_ops: str = "auto",
    communication: str = "auto",
    shard: str = "none",
    export_dir: str | None = None,
    model_parallel: int = 1,
    model: str | None = None,
) -> None:
    """ConfigError, one line, for a setting ``backend``'s engine does not have (its package's
    :class:`~mirrorfit.engine.contract.Capabilities`)."""
    can = capabilities(backend)
    if export_dir and not can.exports_saved_model:
        named = f" --model {model}" if model and ":" in model else ""  # a user's: not recorded
        raise ConfigError(
            f"--export-dir writes a TensorFlow SavedModel, which the {backend} engine does not; "
            "save --checkpoint-dir DIR, then export it (with TensorFlow installed): "
            f"mirrorfit export --checkpoint-dir DIR{named} --export-dir {export_dir}"
        )
    if shard not in SHARD_MODES:
        raise ConfigError(
            f"--shard {shard!r}: choose none (every device holds the whole "
            "state), optimizer (ZeRO-1: the optimizer state split over the "
            "devices) or all (FSDP: the weights too)"
        )
    if shard != "none" and not can.splits_state:
        raise ConfigError(
            f"--shard {shard} splits the training state over the devices on the JAX engine "
            f"only; add {_engines_that(lambda c: c.splits_state)}, or drop --shard"
        )
    if model_parallel != 1 and not can.splits_state:
        raise ConfigError(
            f"--model-parallel {model_parallel} splits the weights over the devices on the JAX "
            f"engine only; add {_engines_that(lambda c: c.splits_state)}, or drop "
            "--model-parallel"
        )
    if strategy not in can.strategies:
        raise ConfigError(
            f"--strategy {strategy} {STRATEGY_NEEDS[strategy]}; with --backend {backend} use "
            "--strategy auto (data parallel over the devices) or multi-worker (over "
            f"processes), or {_engines_that(lambda c: strategy in c.strategies)}"
        )
    if cross_device_ops != "auto" and not can.chooses_collectives:
        raise ConfigError(
            f"--cross-device-ops {cross_device_ops} chooses TensorFlow's "
            f"collectives; under --backend {backend} XLA does the all-reduce: drop it"
        )
    if communication != "auto" and not can.chooses_collectives:
        raise ConfigError(
            f"--communication {communication} chooses TensorFlow's multi-worker "
            f"collectives: drop it with --backend {backend}"
        )


def prepare(backend: str, *, verbose: bool = False) -> None:
    """Before Keras and the framework load: tell Keras the backend, and keep the framework's C++ log
    off stderr unless ``verbose`` (all of it) or the user set ``TF_CPP_MIN_LOG_LEVEL``. ConfigError
    if Keras was already imported with another backend (a Python caller).
    (why: docs/architecture.md#the-backend)
    """
    keras = sys.modules.get("keras")
    if keras is not None and getattr(keras, "backend", None) is not None:
        loaded = keras.backend.backend()
        if loaded != backend:
            raise ConfigError(
                f"Keras was already loaded with the {loaded} backend; choose "
                f"--backend {loaded}, or set KERAS_BACKEND={backend} before "
                "importing keras"
            )
    os.environ["KERAS_BACKEND"] = backend
    if "TF_CPP_MIN_LOG_LEVEL" not in os.environ:  # TF's and XLA's C++ logging (jaxlib's too)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0" if verbose else "3"
    if not verbose:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def import_framework(backend: str) -> None:
    """Import ``backend``'s framework now, its start-up lines on stderr filtered by
    ``TF_CPP_MIN_LOG_LEVEL`` (see :mod:`mirrorfit._frameworks`)."""
    if backend == "tensorflow":
        import_tensorflow("--backend tensorflow (the default, unless $KERAS_BACKEND says jax)")
    elif backend == "jax":
        try:  # before Keras, which imports it on its own import and would fail there
            import jax  # noqa: F401
        except ImportError as e:  # jax without jaxlib names no module
            if (e.name or "").split(".")[0] in ("jax", "jaxlib") or not installed("jaxlib"):
                raise ConfigError(_jax_missing()) from None
            raise


def _jax_missing() -> str:
    return (
        f"--backend jax needs JAX: {install_hint('jax')} (on NVIDIA GPUs then "
        "jax[cuda12] of the same version)"
    )


def import_tensorflow(needed_by: str | None = None, extra: str = "tensorflow") -> None:
    """Import TensorFlow now, whatever the backend (a JAX run reading image folders or
    writing TensorBoard scalars loads it too), its start-up lines filtered as
    :func:`import_framework` filters them. Not installed: ConfigError saying ``needed_by``
    needs it and what to install (``extra``); with ``needed_by`` None, nothing (said where it
    is needed, in the words of what needs it)."""
    if sys.modules.get("tensorflow") is not None:
        return
    with tensorflow_start_filtered():
        try:
            import tensorflow  # noqa: F401 (loaded here, filtered, for what imports it next)
        except ImportError as e:
            if (e.name or "").split(".")[0] != "tensorflow" or installed("tensorflow"):
                raise ConfigError(_broken(e, needed_by)) from None  # installed, not loading
            if needed_by is None:
                return
            jax = (
                ", or train with --backend jax"
                if needed_by.startswith("--")
                else ", or mirrorfit.setup(backend='jax')"
                if needed_by.startswith("mirrorfit.setup")
                else ""
            )
            raise ConfigError(f"{needed_by} needs TensorFlow: {install_hint(extra)}{jax}") from None
        except Exception as e:  # e.g. protobuf's "Descriptors cannot be created directly"
            raise ConfigError(_broken(e, needed_by)) from None


def _broken(error: Exception, needed_by: str | None) -> str:
    """One line for a TensorFlow that is installed but does not import: its cause (the last
    ``...Error:`` line of the message TensorFlow wraps) and its own summary line."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    causes = [ln for ln in lines if re.match(r"\w+(Error|Exception): ", ln)]
    summary = [ln for ln in lines if ln.startswith("Failed to load")]
    said = "; ".join(
        (causes[-1:] or [f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__])
        + summary
    )[:240]
    jax = ", or train with --backend jax" if (needed_by or "").startswith("--") else ""
    return (
        f"TensorFlow is installed but does not load ({said}); reinstall it (pip install "
        f"--force-reinstall tensorflow==2.21.0){jax}"
    )


def loaded() -> list[ModuleType]:
    """The engine packages this process has imported (what a failure is asked about)."""
    return [sys.modules[name] for name in ENGINES.values() if name in sys.modules]


def load(backend: str) -> ModuleType:
    """The engine package of ``backend`` (``mirrorfit.engine.tensorflow`` / ``.jax``); a
    missing framework is one ConfigError line saying what to install."""
    import_framework(backend)
    try:
        module = importlib.import_module(ENGINES[backend])
        module.build_distribution  # noqa: B018 (the framework loads here, or ImportError says why)
        return module
    except ImportError as e:
        if backend == "jax" and (e.name or "").split(".")[0] in ("jax", "jaxlib"):
            raise ConfigError(_jax_missing()) from None
        if backend == "tensorflow" and (e.name or "").split(".")[0] == "tensorflow":
            raise ConfigError(
                "--backend tensorflow needs TensorFlow: "
                f"{install_hint('tensorflow')}, or train with --backend jax"
            ) from None
        raise


__all__ = [
    "BACKENDS",
    "STRATEGY_NEEDS",
    "capabilities",
    "ENGINES",
    "DEFAULT",
    "resolve",
    "installed",
    "install_hint",
    "split_batch",
    "check_settings",
    "SHARD_MODES",
    "prepare",
    "import_framework",
    "import_tensorflow",
    "tensorflow_start_filtered",
    "loaded",
    "load",
]
