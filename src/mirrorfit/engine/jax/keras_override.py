"""The JAX engine for a model with its own ``train_step`` or ``test_step``: Keras's stateless
``train_step(state, data)`` / ``test_step(state, data)`` run over the **global** batch, as one
compiled program per call of S steps. The batch is split on the mesh's data axis and the state
replicated; XLA's partitioner inserts the collectives (Keras's ``DataParallel`` way), so the
user's step sees what it sees on one device: its mean is over the global batch, and its update
is one device's. (why not per replica: docs/architecture.md#the-engines-under-fit)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mirrorfit.engine.jax.placement import AXIS
from mirrorfit.engine.jax.sharding import (
    distinct_arrays,
    held_by_model,
    peak_device_bytes,
    state_bytes_per_device,
)
from mirrorfit.errors import FitError
from mirrorfit.fitting import metrics as fit_metrics


def runs_whole(model) -> bool:
    """Whether ``model`` defines its own ``train_step`` or ``test_step`` (run here)."""
    return fit_metrics.overrides(model, "train_step") or fit_metrics.overrides(model, "test_step")


def check(model, placement, distribution=None) -> None:
    """FitError (a ValueError), one line, for what a model's own step cannot run with."""
    name = type(model).__name__
    for step, given in fit_metrics.own_step_arguments(model).items():
        if given != 2:  # a TypeError from inside the step, else
            raise FitError(
                f"{name}.{step} takes {given} argument(s); on JAX Keras calls {step}(self, "
                "state, data) and takes (logs, state) back (keras.io's guide 'Customizing "
                "what happens in fit() with JAX'); write that, or use backend 'tensorflow'"
            )
    _check_optimizers_carried(model)
    if getattr(placement, "shard", "none") != "none":
        raise FitError(
            f"{name} has its own train_step/test_step, which runs over the global batch with "
            f"the state replicated; shard={placement.shard!r} splits the state for mirrorfit's "
            "own step only: use shard='none', or override compute_loss instead"
        )
    if distribution is not None and distribution.workers > 1:
        raise FitError(
            f"{name} has its own train_step/test_step, which the JAX engine runs in one "
            "process only; train it on one worker, or use backend='tensorflow'"
        )


def _check_optimizers_carried(model) -> None:
    """FitError for optimizers of the model's own (a GAN's two) that Keras's JAX state does not
    carry: it holds ``model.optimizer``'s variables only, unless the model overrides
    ``_get_jax_state`` (Keras's own ``fit`` fails there in a long traceback, or never advances
    those optimizers' state)."""
    import keras

    own = sorted(
        key
        for key, value in vars(model).items()
        if isinstance(value, keras.optimizers.Optimizer) and value is not model.optimizer
    )
    if own and not fit_metrics.overrides(model, "_get_jax_state"):
        raise FitError(
            f"{type(model).__name__} holds optimizers of its own ({', '.join(own)}), whose "
            "variables Keras's JAX state does not carry into its train_step; override "
            "_get_jax_state and jax_state_sync to carry them (docs/keras-script.md, 'Per "
            "engine'), or use backend='tensorflow'"
        )


class OverrideRunner:
    """The model's state, replicated on the mesh of ``placement``, and its own steps compiled
    over the global batch. The same methods as :class:`mirrorfit.engine.jax.keras_fit.Runner`."""

    per_replica = False  # one program over the global batch
    jit_compile = True  # every call, as JAX compiles it

    def __init__(
        self,
        model,
        placement,
        *,
        accum_steps: int = 1,
        jit_compile: bool = True,
        sync_batchnorm: bool = False,
    ) -> None:
        # sync_batchnorm: the step sees the global batch, so its statistics are the global
        # batch's already
        self.grid = getattr(placement, "model_parallel", 1) > 1
        if accum_steps != 1:
            whose = (
                "on a 2-D mesh (model_parallel) the step"
                if self.grid and not runs_whole(model)
                else f"{type(model).__name__}'s own train_step"
            )
            raise FitError(
                f"accum_steps={accum_steps}: {whose} takes the whole batch, which mirrorfit "
                "cannot split into micro-batches; leave accum_steps at 1"
            )
        self.model, self.placement = model, placement
        # a 2-D mesh: the batch split over its data groups, each weight as it was made (over
        # the model axis); XLA's partitioner inserts both kinds of collectives
        self.mesh = placement.grid if self.grid else placement.mesh
        self.replicas = placement.data_parallel
        self.accum_steps = 1
        self._replicated = NamedSharding(self.mesh, P())
        self._split = NamedSharding(self.mesh, P(None, AXIS))
        self._state_shardings: list = []
        self._calls: dict = {}
        self._logs = None  # the last step's, as arrays
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        if self.grid:  # ZeRO over the data axis beside the mesh (shard="optimizer")
            from mirrorfit.engine.jax.created_sharded import spread_slots

            spread_slots(model.optimizer, placement)

    # -- state -------------------------------------------------------------------------------
    def load(self) -> None:
        """The Keras variables as the devices' state, the metrics reset."""
        self.model.reset_metrics()
        self._initial_metrics = [np.asarray(v.value) for v in self.model.metrics_variables]
        self.reload()
        self.reset_metrics()

    def reload(self) -> None:
        """The model's and optimizer's variables as the devices' state again."""
        # Read and written back through the hooks Keras's own fit calls: a model with several
        # optimizers (a GAN's two) overrides them to carry every optimizer's variables.
        state = self.model._get_jax_state(  # noqa: SLF001 (the hook such models override)
            trainable_variables=True, non_trainable_variables=True, optimizer_variables=True
        )
        state = distinct_arrays(*state)
        self._state_shardings = [[self._sharding_of(v) for v in group] for group in state]
        self.state = [
            self._put(group, shardings, own=True)
            for group, shardings in zip(state, self._state_shardings)
        ]

    def sync(self) -> None:
        """The devices' state into the Keras variables: the same arrays, no copy (done after
        every call, so the variables hold the state's live buffers between calls, as Keras's
        own fit leaves them: one copy of the state on the devices, not two)."""
        m = self.model
        groups = ("trainable_variables", "non_trainable_variables", "optimizer_variables")
        values = [*self.state, self.metrics]
        m._jax_state = {  # noqa: SLF001 (what Keras's own fit hands jax_state_sync)
            name: list(group) for name, group in zip((*groups, "metrics_variables"), values)
        }
        m._jax_state_synced = False  # noqa: SLF001
        m.jax_state_sync()
        m._jax_state = None  # noqa: SLF001 (the next call donates these buffers)

    def reset_metrics(self) -> None:
        self.metrics = self._put(self._initial_metrics)
        self._logs = None

    def logs(self) -> dict:
        """The logs the last step returned, every key as the step named it (Keras's fit hands
        them on so); before any step, the metrics' results."""
        if self._logs is None:
            for var, value in zip(self.model.metrics_variables, self.metrics):
                var.assign(np.asarray(value))
            return fit_metrics.results(self.model)
        return fit_metrics.pythonified(self._logs, np.asarray)

    def loss_later(self):
        """The ``loss`` the last step returned, read when called (None without one)."""
        loss = None if self._logs is None else self._logs.get("loss")
        if loss is None or isinstance(loss, dict) or np.size(loss) != 1:
            return lambda: None
        loss = jnp.copy(loss)  # the next call donates the state, not the logs: kept anyway
        return lambda: float(np.asarray(loss))

    def state_bytes_per_device(self) -> int:
        state = [a for group in self.state for a in group]
        return state_bytes_per_device([*state, *held_by_model(self.model)])  # as keras_fit's

    def peak_device_bytes(self) -> int | None:
        return peak_device_bytes(self.mesh.local_devices)

    def describe_sharding(self) -> str:
        if self.grid:
            zero = {
                "optimizer": "; the optimizer state split over the data groups too",
                "all": "; the weights and optimizer state split over the data groups too",
            }.get(self.placement.shard, "")
            return (
                f"a 2-D mesh: each weight split over the {self.placement.model_parallel} "
                f"devices of a model group, the global batch over {self.replicas} data groups"
                + zero
            )
        return (
            f"replicated: every device holds the whole state; the model's own step runs over "
            f"the global batch, split over {self.replicas} devices"
        )

    def from_chief(self, distribution=None) -> None:  # one process only (check)
        """Nothing: one process."""

    # -- the compiled calls ------------------------------------------------------------------
    def put(self, block: dict):
        """A block of batches as given (leaves ``[S, B, ...]``) on the devices: split on the
        batch axis, or, a partial batch the data groups do not divide, whole on each."""
        rows = jax.tree.leaves(block)[0].shape[1]
        return jax.device_put(block, self._split if rows % self.replicas == 0 else self._replicated)

    def train(self, block, steps: int) -> None:
        call = self._call("train", block)
        self.state, self.metrics, self._logs = call(
            self.state, self.metrics, block, np.int32(steps)
        )
        self.sync()  # the call donated the buffers the variables held

    def evaluate(self, block, batches: int) -> None:
        call = self._call("test", block)
        self.metrics, self._logs = call(self.state, self.metrics, block, np.int32(batches))
        self.sync()

    def compute_only(self, block, steps: int) -> None:
        raise self._one_piece()

    def all_reduce_only(self, steps: int) -> None:
        raise self._one_piece()

    def _one_piece(self) -> FitError:
        """--profile: this step has no parts to time apart."""
        whose = (
            "the step on a 2-D mesh (model_parallel), which XLA partitions,"
            if self.grid and not runs_whole(self.model)
            else f"{type(self.model).__name__}'s own train_step"
        )
        return FitError(
            f"{whose} is one piece, which the profile cannot time in parts; time it with "
            "mirrorfit bench --model"
        )

    def _call(self, kind: str, block):
        key = (kind, jax.tree.structure(block))
        if key not in self._calls:
            fn = self._train_steps if kind == "train" else self._test_steps
            donate = (0, 1) if kind == "train" else (1,)
            # the state leaves as it came (split where it was made split); the rest whole
            out = self._replicated
            if kind == "train":
                out = (self._state_shardings, self._replicated, self._replicated)
            self._calls[key] = jax.jit(fn, out_shardings=out, donate_argnums=donate)
        return self._calls[key]

    def _train_steps(self, state, metrics, block, steps):
        model = self.model

        def step(i, carry):
            (trainable, non_trainable, optimizer), metrics, _ = carry
            data = jax.tree.map(lambda a: a[i], block["data"])
            logs, new = model.train_step((trainable, non_trainable, optimizer, metrics), data)
            return [list(new[0]), list(new[1]), list(new[2])], list(new[3]), _arrays(logs)

        return _looped(step, (state, metrics), steps)

    def _test_steps(self, state, metrics, block, batches):
        model = self.model
        trainable, non_trainable, _ = state

        def step(i, carry):
            _, metrics, _ = carry
            data = jax.tree.map(lambda a: a[i], block["data"])
            logs, new = model.test_step((trainable, non_trainable, metrics), data)
            return None, list(new[2]), _arrays(logs)

        _, metrics, logs = _looped(step, (None, metrics), batches)
        return metrics, logs

    def _put(self, values, shardings=None, *, own: bool = False) -> list:
        """``values`` on the devices, whole on each or as ``shardings`` say. ``own``: an array
        already so placed is taken as it is, the Keras variable's own buffer, which the next
        call donates and :meth:`sync` then replaces (no second copy at an epoch's start; the
        values distinct arrays); else a copy."""
        shardings = shardings or [self._replicated] * len(values)
        return [
            v
            if own and isinstance(v, jax.Array) and v.sharding.is_equivalent_to(s, v.ndim)
            else jax.device_put(jnp.asarray(v), s, may_alias=False)
            for v, s in zip(values, shardings)
        ]

    def _sharding_of(self, value):
        """Where a value of the state lives: as made, where it was made on this mesh (split
        over its model axis), else whole on every device."""
        held = getattr(value, "sharding", None)
        if isinstance(held, NamedSharding) and held.mesh == self.mesh:
            return held
        return self._replicated


def _looped(step, carry, n):
    """``step(i, carry)`` for i < n (n >= 1): the last carry, with the logs it returned."""
    first = step(0, (*carry, None))
    return jax.lax.fori_loop(1, n, step, first)


def _arrays(logs) -> dict:
    return jax.tree.map(jnp.asarray, dict(logs))


__all__ = ["OverrideRunner", "check", "runs_whole"]
