"""Keras variables created on their shards under ``shard="all"``: a Keras distribution whose
variable layouts follow mirrorfit's shape rule (:func:`~mirrorfit.engine.jax.sharding.
shard_axis`), so that no device holds a whole split weight, at build, during ``fit`` or after
it, and the model's own variables are the sharded state. Keras places each variable when it
is made (a large one is initialised on its shards; a small one whole first, then split).
(why a distribution: docs/keras-script.md#a-model-larger-than-one-device)
"""

from __future__ import annotations

from keras.distribution import DataParallel, DeviceMesh, TensorLayout
from keras.src.distribution.distribution_lib import Distribution  # not exported by Keras

from mirrorfit.engine.jax.placement import AXIS, MODEL_AXIS
from mirrorfit.engine.jax.sharding import shard_axis


class ShapeSharded(DataParallel):
    """``DataParallel``'s mesh over the placement's devices, each trainable variable split
    along the axis :func:`shard_axis` picks for it (the optimizer's slots follow their
    variable, as Keras makes them), every other variable whole on each device. Keras's own
    ``predict``/``evaluate``/``fit`` get each batch whole on every device, which any batch
    size fits (their data stay as the framework gives them)."""

    def __init__(self, placement):
        devices = list(placement.mesh.devices.flat)
        mesh = DeviceMesh(shape=(len(devices),), axis_names=[AXIS], devices=devices)
        super().__init__(device_mesh=mesh, auto_shard_dataset=False)
        self._replicas = len(devices)

    def get_variable_layout(self, variable):
        return _by_shape(variable, self.device_mesh, AXIS, self._replicas)

    def get_data_layout(self, data_shape):
        return TensorLayout([None] * len(data_shape), self.device_mesh)


class GridSharded(Distribution):
    """The 2-D mesh of ``model_parallel`` (``data`` x ``model``): each trainable variable split
    along the axis :func:`shard_axis` picks for the ``model`` axis's size, over that axis
    (whole on every data group), the rest whole on each device. Batches stay whole for Keras's
    own calls, as :class:`ShapeSharded`'s; ``mirrorfit.fit`` splits them on ``data``."""

    def __init__(self, placement):
        grid = placement.grid
        mesh = DeviceMesh(
            shape=tuple(grid.devices.shape),
            axis_names=[AXIS, MODEL_AXIS],
            devices=grid.devices,
        )
        super().__init__(mesh, batch_dim_name=AXIS, auto_shard_dataset=False)
        self._split = placement.model_parallel

    @property
    def num_model_replicas(self):
        return self.device_mesh.shape[0]

    def get_variable_layout(self, variable):
        return _by_shape(variable, self.device_mesh, MODEL_AXIS, self._split)

    def get_data_layout(self, data_shape):
        return TensorLayout([None] * len(data_shape), self.device_mesh)

    def get_tensor_layout(self, path):
        return None

    def distribute_dataset(self, dataset):
        return dataset


def _by_shape(variable, mesh, axis_name: str, devices: int) -> TensorLayout:
    """A trainable variable's layout by the shape rule: split over ``axis_name``'s
    ``devices`` along the axis :func:`shard_axis` picks, else whole; one given already (an
    optimizer's slot, made like its variable) kept."""
    if getattr(variable, "_layout", None) is not None:
        return variable._layout
    spec: list = [None] * len(variable.shape)
    if variable.trainable:
        constrained = getattr(variable, "constraint", None) is not None
        axis = shard_axis(variable.shape, devices, constrained=constrained)
        if axis is not None:
            spec[axis] = axis_name
    return TensorLayout(spec, mesh)


def distribution(placement) -> Distribution | None:
    """The Keras distribution that creates variables on their shards under ``shard="all"``
    or ``model_parallel`` in one process; None elsewhere: the state is split for the step
    only (several workers: each process builds its model whole, split when the run
    starts)."""
    if getattr(placement, "model_parallel", 1) > 1:
        return GridSharded(placement)
    if getattr(placement, "shard", "none") == "all" and placement.workers == 1:
        return ShapeSharded(placement)
    return None


__all__ = ["GridSharded", "ShapeSharded", "distribution"]
