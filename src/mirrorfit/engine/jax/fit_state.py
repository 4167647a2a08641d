"""``mirrorfit.fit``'s checkpoint state on JAX where the runner splits it (``shard="optimizer"``
or ``"all"``): an Orbax ``state/`` of the arrays as the devices hold them, each process writing
its own shards in the background (:mod:`~mirrorfit.engine.jax.orbax_state`, as ``mirrorfit
train`` writes them), in place of Keras's ``save_weights``, which makes every weight whole on
the chief's host first. Read back re-sharded for this run's devices. (why: docs/jax.md#checkpoints)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mirrorfit.engine.jax import orbax_state
from mirrorfit.engine.jax.placement import local_value


class FitState:
    """What ``checkpoint_dir`` saves of a :class:`~mirrorfit.engine.jax.keras_fit.Runner`.
    ``split``: the runner splits its state (this run writes Orbax); ``collective``: split over
    several processes, so every process writes its own shards into one folder."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.split = runner.layout is not None or any(runner._frozen_specs)
        self.collective = self.split and runner.placement.workers > 1
        self._writer = None

    def write(self, folder: Path) -> orbax_state.Background:
        """Start writing the runner's state (synced) into ``folder/state``; returns once its
        arrays are off the devices (the next step may overwrite them)."""
        if self._writer is None:
            self._writer = orbax_state.async_checkpointer()
        return orbax_state.write(folder, self._arrays(), self._writer)

    def read(self, folder: Path) -> None:
        """``folder/state`` into the model's and optimizer's variables, laid out as this run
        holds them. StructureError for another model's arrays; ValueError or OSError for
        damage (nothing assigned)."""
        targets = self._targets()
        orbax_state.check_against(orbax_state.saved_shapes(folder), targets, self._names())
        self._adopt(orbax_state.read(folder, targets))

    def _variables(self) -> dict[str, list]:
        m = self.runner.model
        return {
            "trainable": list(m.trainable_variables),
            "non_trainable": list(m.non_trainable_variables),
            "optimizer": list(m.optimizer.variables),
        }

    def _arrays(self) -> dict[str, list]:
        """GROUPS -> arrays: the weights and optimizer slots as the devices hold them, the
        frozen weights as laid out, the statistics as the model holds them (synced)."""
        r = self.runner
        statistics = [
            np.asarray(v.value) for v in r._statistics_of(r.model.non_trainable_variables)
        ]
        return {
            "trainable": list(r.state.trainable),
            "non_trainable": r._merged(statistics, r.frozen_values),
            "optimizer": list(r.state.optimizer),
        }

    def _targets(self) -> dict[str, list]:
        """Shapes and dtypes of this run's variables, with the runner's shardings (another
        device count than the saving run's: re-sharded on read)."""
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P

        r = self.runner
        whole = NamedSharding(r.mesh, P())
        statistics = [whole] * sum(not f for f in r._frozen)
        shardings = {
            "trainable": r._shardings["trainable"],
            "non_trainable": r._merged(statistics, r._frozen_shardings),
            "optimizer": r._shardings["optimizer"],
        }
        return {
            group: [
                jax.ShapeDtypeStruct(tuple(map(int, v.shape)), np.dtype(v.dtype), sharding=s)
                for v, s in zip(variables, shardings[group])
            ]
            for group, variables in self._variables().items()
        }

    def _names(self) -> dict[str, list[str]]:
        return {g: [v.path for v in vs] for g, vs in self._variables().items()}

    def _adopt(self, arrays: dict[str, list]) -> None:
        """Restored arrays into the variables: one process, as laid out where the variable
        holds its value so already (created on its shards), else gathered whole onto the
        host; several processes, made whole on every device first (a collective every worker
        runs), then this process's copy."""
        placement = self.runner.placement
        for group, variables in self._variables().items():
            values = arrays[group]
            if placement.workers > 1:
                values = [local_value(v) for v in placement.replicated(values)]
            for var, value in zip(variables, values):
                keep = placement.workers == 1 and _laid_out_alike(var.value, value)
                var.assign(value if keep else np.asarray(value))


def _laid_out_alike(held, value) -> bool:
    import jax

    return (
        isinstance(held, jax.Array)
        and isinstance(value, jax.Array)
        and held.sharding.is_equivalent_to(value.sharding, value.ndim)
    )
