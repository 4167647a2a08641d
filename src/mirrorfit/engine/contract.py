"""The seam between the shared code (``mirrorfit.fit``'s loop, the training job, checkpoints) and
an engine, typed: the package's functions (:class:`Engine`), the distribution
``build_distribution`` returns (:class:`Distribution`), its ``keras_fit`` module
(:class:`FitEngine`), the :class:`FitRunner` holding a compiled model's compiled calls, and
the :class:`CheckpointState` of a state split over the devices. An engine is a package under
``mirrorfit/engine/`` named in :data:`mirrorfit.engine.backends.ENGINES`. Plain typing: no
framework imported.
(why, and a third engine: docs/architecture.md#the-engine-contract)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do, declared in its package (``CAPABILITIES``) and read by the settings
    check before the framework loads (:func:`mirrorfit.engine.backends.check_settings`)."""

    strategies: tuple[str, ...]  # the --strategy values it runs ("auto" among them)
    splits_state: bool  # --shard optimizer|all and --model-parallel
    exports_saved_model: bool  # writes a SavedModel itself (--export-dir)
    compiles_every_step: bool  # the whole step is always compiled (--xla is what it does)
    chooses_collectives: bool  # --cross-device-ops and --communication
    syncs_batchnorm_under_xla: bool  # synchronized BatchNormalization in a jit-compiled step


class Distribution(Protocol):
    """Where a run's replicas are: devices and processes, and the collectives between them."""

    backend: str
    replicas: int  # over every process
    local_replicas: int  # this process's
    workers: int
    worker_index: int
    is_chief: bool  # the process that writes outputs
    task: str  # this process in words, e.g. "worker 1"
    strategy_name: str  # for the summary

    @property
    def input_split(self) -> str:
        """What each process reads: ``backends.GLOBAL_BATCH``, ``WORKER_SHARE`` or
        ``COORDINATOR``."""

    def agree(self, flag: bool) -> bool:
        """True on every process if ``flag`` is True on any (a collective)."""

    def all_equal(self, value: int) -> bool:
        """Whether every process holds the same ``value`` (a collective)."""

    def gather(self, values: Sequence[int]) -> Any:
        """Every process's small non-negative ints, one row per worker (a collective)."""

    def describe(self) -> str:
        """One line for the start of a run."""


class CheckpointState(Protocol):
    """An engine's checkpoint files of a state split over the devices (``FitEngine.
    checkpoint_state(runner)``); a whole state is Keras's own ``save_weights``."""

    split: bool  # the state is split over the devices (Orbax's files)
    # Every process writes its own part into the same folder (a split state on several
    # processes); else only the chief's folder is kept.
    collective: bool

    def write(self, folder) -> Any:
        """Write the model's and the optimizer's variables into ``folder``: a handle whose
        ``wait()`` returns when the background write completes."""

    def read(self, folder) -> None:
        """Restore them from ``folder`` (an error names what does not match)."""


class Engine(Protocol):
    """The engine package itself (``mirrorfit.engine.<name>``)."""

    CAPABILITIES: Capabilities

    def configure_devices(self, **settings) -> Any:
        """The devices to replicate over (a :class:`~mirrorfit.engine.device_setup.
        DeviceSetup`), set before the framework starts them; with ``cluster`` (a multi-worker
        task), joined to it where the engine joins with its devices."""

    def keras_setup(
        self,
        replicas: int | None,
        devices: tuple[str, ...],
        shard: str = "none",
        cluster: Any = None,
    ) -> tuple[Any, Any, Any]:
        """``mirrorfit.setup``'s (DeviceSetup, placement, distribution) for a Keras script;
        with ``cluster``, this worker joined to it (the distribution: None without one)."""

    def creating_variables(self, placement) -> Any:
        """A context in which the Keras variables made are placed as ``placement`` holds
        them (on their shards, where the engine splits them at creation)."""

    def build_distribution(self, setup, **settings) -> Distribution: ...

    def list_devices(self) -> list[Mapping[str, str]]: ...

    def seed(self, value: int) -> None: ...

    def peer_failure(self, error: BaseException) -> bool:
        """Whether ``error`` is a collective that failed because another task went away."""

    def stopped_answering(self, cluster) -> list[str]:
        """The tasks of ``cluster`` that went away, once :meth:`peer_failure` said so."""

    def in_job(self) -> bool:
        """Whether this process joined a multi-worker job whose failed task must exit at
        once, without the framework's teardown."""


class FitRunner(Protocol):
    """What ``mirrorfit.fit``'s loop (``fitting/``) drives: a compiled model's compiled calls on
    the engine's placement, built by :meth:`FitEngine.runner`. A block is a dict of global
    batches (leaves ``[S, B, ...]``: ``x``, ``y``, ``w``, ``mask``, ``scale``, or ``data`` for
    a model's own step); the model's Keras variables are the state between :meth:`sync` and
    :meth:`reload`."""

    replicas: int
    jit_compile: bool

    def load(self) -> None:
        """The Keras variables as the devices' state, the metrics reset (an epoch's start)."""

    def reload(self) -> None:
        """The variables as the devices' state again (a callback changed them), metrics kept."""

    def sync(self) -> None:
        """The devices' state into the Keras variables (a callback reads or saves them)."""

    def from_chief(self, distribution) -> None:
        """Every worker's state made the chief's (several workers)."""

    def reset_metrics(self) -> None: ...

    def logs(self) -> dict[str, float]:
        """The metrics so far (reading them waits for the calls made)."""

    def loss_later(self) -> Callable[[], float | None]:
        """A reader of the mean training loss so far, for later (no wait now)."""

    def put(self, block: dict) -> Any:
        """A block on the devices, each replica's share where it is used."""

    def train(self, block: Any, steps: int) -> None:
        """``steps`` optimizer steps over the first ``steps`` batches of a put block."""

    def evaluate(self, block: Any, batches: int) -> None:
        """The metrics updated with the first ``batches`` batches of a put block."""

    def compute_only(self, block: Any, steps: int) -> None:
        """--profile: ``steps`` steps' forward and backward passes alone; waits for them."""

    def all_reduce_only(self, steps: int) -> None:
        """--profile: ``steps`` of the step's all-reduces of gradient-sized arrays; waits."""

    def state_bytes_per_device(self) -> int: ...

    def peak_device_bytes(self) -> int | None: ...

    def describe_sharding(self) -> str: ...


class FitEngine(Protocol):
    """An engine's ``keras_fit`` module (``mirrorfit.engine.<name>.keras_fit``): what
    ``mirrorfit.fit`` needs of it."""

    READ_AGAIN: frozenset[str]  # Keras adapters whose first epoch is read anew after the build

    def placement(self, model: Any, chosen: Any = None, /) -> Any:
        """Where the engine runs ``model``: ``chosen`` (``mirrorfit.setup``'s), else its own."""

    def replicas(self, placement: Any, /) -> int: ...

    def pads(self, model: Any, step: str, placement: Any = None, accum_steps: int = 1, /) -> bool:
        """Whether ``step``'s batches are padded to the global batch (else given as they are,
        to a model's own step)."""

    def check_model(self, model: Any, placement: Any, distribution: Any = None, /) -> None:
        """FitError for a model the engine cannot train on ``placement``."""

    def runner(
        self, model: Any, placement: Any, *, sample: Any = None, **settings: Any
    ) -> FitRunner:
        """The runner for ``model``: ``accum_steps``, ``jit_compile``, ``sync_batchnorm``."""

    def scope(self, placement: Any, /) -> Any:
        """A context in which the model builds its variables as ``placement`` holds them."""

    def callback_context(self, placement: Any, /) -> Any:
        """The context a Keras callback runs in (TensorFlow: the strategy's, cross-replica)."""

    def checkpoint_state(self, runner: Any, /) -> CheckpointState | None:
        """Orbax's split state where the engine splits it, else None (``save_weights``)."""

    def ready(self, value: Any, /) -> None:
        """Wait for a put block to be on the devices."""


__all__ = [
    "Distribution",
    "CheckpointState",
    "Engine",
    "FitRunner",
    "FitEngine",
]
