"""The JAX engine's checkpoint files: under ``--shard none`` one NumPy ``state.npz`` of the
model's and the optimizer's variables (by position, with paths and shapes to check), under
``--shard optimizer|all`` an Orbax checkpoint (:mod:`mirrorfit.engine.jax.orbax_state`);
either read back into any run of the engine. Imports no JAX. (why: docs/jax.md#checkpoints)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mirrorfit.artifacts.checkpoint_meta import StructureError

FILE = "state.npz"


def _describe(variables) -> list[list]:
    return [[v.path, list(map(int, v.shape))] for v in variables]


def write_arrays(folder: Path, groups: dict[str, list]) -> None:
    """``folder/state.npz`` holding every group's variables (``{"model": [...]}``)."""
    arrays = {}
    layout = {}
    for group, variables in groups.items():
        layout[group] = _describe(variables)
        for i, v in enumerate(variables):
            arrays[f"{group}/{i}"] = np.asarray(v.value)
    arrays["layout"] = np.frombuffer(json.dumps(layout).encode(), dtype=np.uint8)
    with open(folder / FILE, "wb") as f:
        np.savez(f, **arrays)


def read_arrays(folder: Path, groups: dict[str, list]) -> None:
    """Assign ``folder/state.npz``'s arrays to ``groups``' variables. StructureError when the
    counts or shapes differ; other errors (OSError, ValueError, a bad zip) when the file is
    damaged."""
    with np.load(folder / FILE, allow_pickle=False) as f:
        layout = json.loads(bytes(f["layout"]).decode())
        for group, variables in groups.items():
            saved = layout.get(group)
            if saved is None:
                raise StructureError(f"no {group} variables")
            if len(saved) != len(variables):
                raise StructureError(
                    f"{len(saved)} {group} variables saved, this run has {len(variables)}"
                )
            for (path, shape), v in zip(saved, variables):
                if list(shape) != list(map(int, v.shape)):
                    raise StructureError(
                        f"{group} variable {path} has shape {shape}, this "
                        f"run's {v.path} {list(v.shape)}"
                    )
        values = {
            group: [f[f"{group}/{i}"] for i in range(len(variables))]
            for group, variables in groups.items()
        }
    # The arrays themselves against the variables too: the layout is only what the file says
    # of them. Another dtype is a file this engine did not write (Keras's assign would cast
    # int32 or int8 into float weights, or 5.5 into the step count, silently); a safe cast
    # between integers is kept (the seed state, uint32 on JAX, is int64 on TensorFlow's side
    # of `mirrorfit export`).
    for group, variables in groups.items():
        for i, (value, v) in enumerate(zip(values[group], variables)):
            want = np.dtype(v.dtype)
            if value.dtype.kind == "V" == want.kind and value.itemsize == want.itemsize:
                # NumPy saves ml_dtypes' bfloat16 (a bf16 layer's weights) as raw bytes (|V2)
                value = values[group][i] = value.view(want)
            same = value.dtype == want or (
                value.dtype.kind in "iu"
                and want.kind in "iu"
                and np.can_cast(value.dtype, want, "safe")
            )
            if list(value.shape) != list(map(int, v.shape)) or not same:
                raise ValueError(
                    f"{FILE}'s {group}/{i} is {value.dtype} {list(value.shape)}, "
                    f"not {v.path}'s {v.dtype} {list(v.shape)}"
                )
    # Checked first, assigned after: a mismatch changes nothing.
    for group, variables in groups.items():
        for value, v in zip(values[group], variables):
            v.assign(value)


def read_model_arrays(folder: Path, model) -> None:
    """The model's variables from a JAX checkpoint folder, into ``model`` built by any backend
    (``mirrorfit export`` and ``evaluate``)."""
    if _kind(folder) == "orbax":
        return _orbax().read_model(folder, model)
    read_arrays(folder, {"model": list(model.variables)})


read_model = read_model_arrays  # the name every engine's state module gives it


def _kind(folder: Path) -> str:
    """ "npz" or "orbax": which state a checkpoint folder holds. ValueError (damage) for
    both, or a ``state`` that is not a folder."""
    npz, orbax = folder / FILE, folder / "state"
    if orbax.exists() or orbax.is_symlink():
        if not orbax.is_dir() or orbax.is_symlink():
            raise ValueError("state/ is not a folder")
        if npz.exists():
            raise ValueError(f"it holds both {FILE} and state/, which no run writes")
        return "orbax"
    return "npz"


def _orbax():
    """The Orbax reader and writer (sharded checkpoints), or one line naming the install."""
    from mirrorfit.errors import ConfigError

    try:
        from mirrorfit.engine.jax import orbax_state
        import orbax.checkpoint  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"sharded JAX checkpoints (--shard optimizer|all) are Orbax's, and {e.name} is "
            "not installed: pip install 'mirrorfit[jax]'"
        ) from None
    return orbax_state


class CheckpointState:
    """What :class:`~mirrorfit.artifacts.checkpoint.Checkpointer` saves of a JAX run: the
    runner's model and optimizer, read back into them and then onto the devices. Sharded
    runs write Orbax in the background (:meth:`write` returns a handle to wait on); on several
    processes every process writes into the same folder (``collective``)."""

    backend = "jax"

    def __init__(self, runner) -> None:
        self.runner = runner
        self.sharded = runner.layout is not None
        self.collective = self.sharded and runner.distribution.workers > 1
        self._writer = _orbax().async_checkpointer() if self.sharded else None

    def _groups(self) -> dict[str, list]:
        return {
            "model": list(self.runner.model.variables),
            "optimizer": list(self.runner.optimizer.variables),
        }

    def first_non_finite(self) -> str | None:
        """The first weight holding a NaN or an infinity, with how many (None: all finite);
        sharded: counted on the devices (several processes: a collective)."""
        if self.sharded:
            return self.runner.first_non_finite()
        from mirrorfit.artifacts.finite import first_non_finite

        return first_non_finite(self.runner.model.weights)

    def write(self, folder: Path):
        """Write the state into ``folder``: None once written, or (sharded) an
        :class:`~mirrorfit.engine.jax.orbax_state.Background` still writing."""
        if not self.sharded:
            return write_arrays(folder, self._groups())
        return _orbax().write(folder, self.runner.checkpoint_arrays(), self._writer)

    def read(self, folder: Path) -> None:
        if _kind(folder) == "orbax":
            orbax = _orbax()
            targets = self.runner.checkpoint_targets()
            orbax.check_against(orbax.saved_shapes(folder), targets, self.runner.checkpoint_names())
            self.runner.adopt(orbax.read(folder, targets))
            return
        read_arrays(folder, self._groups())
        self.runner.reload()


__all__ = ["CheckpointState", "StructureError", "read_model_arrays", "read_model", "FILE"]
