"""Keras variables created on their shards under ``shard="all"``: a Keras distribution whose
variable layouts follow mirrorfit's shape rule (:func:`~mirrorfit.engine.jax.sharding.
shard_axis`), so that no device holds a whole split weight, at build, during ``fit`` or after
it, and the model's own variables are the sharded state. Keras places each variable when it
is made (a large one is initialised on its shards; a small one whole first, then split).
Weights loaded into such a model (``load_weights``, ``load_model``, ``set_weights``) go from
the host straight into their shards (:func:`_load_onto_shards`).
(why a distribution: docs/keras-script.md#a-model-larger-than-one-device)
"""

from __future__ import annotations

import math

import jax
import numpy as np
from keras.distribution import DataParallel, DeviceMesh, TensorLayout
from keras.src.backend.jax import core as keras_jax
from keras.src.distribution.distribution_lib import Distribution  # not exported by Keras

from mirrorfit.engine.jax.placement import AXIS, MODEL_AXIS
from mirrorfit.engine.jax.sharding import MIN_ELEMENTS, shard_axis


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
    (whole on every data group), the rest whole on each device. ZeRO beside it, over the
    ``data`` axis, along another axis the same rule picks for the data groups: under
    ``shard="all"`` the weights (and so their optimizer slots), under ``"optimizer"`` the
    slots alone (:func:`spread_slots`). Batches stay whole for Keras's own calls, as
    :class:`ShapeSharded`'s; ``mirrorfit.fit`` splits them on ``data``."""

    def __init__(self, placement):
        grid = placement.grid
        mesh = DeviceMesh(
            shape=tuple(grid.devices.shape),
            axis_names=[AXIS, MODEL_AXIS],
            devices=grid.devices,
        )
        super().__init__(mesh, batch_dim_name=AXIS, auto_shard_dataset=False)
        self._split, self._groups = placement.model_parallel, placement.data_parallel
        self.shard = placement.shard

    @property
    def num_model_replicas(self):
        return self.device_mesh.shape[0]

    def get_variable_layout(self, variable):
        given = getattr(variable, "_layout", None) is not None  # a slot: as its variable
        layout = _by_shape(variable, self.device_mesh, MODEL_AXIS, self._split)
        if self.shard == "all" and variable.trainable and not given:
            constrained = getattr(variable, "constraint", None) is not None
            return self.over_data(layout, variable.shape, constrained=constrained)
        return layout

    def over_data(self, layout: TensorLayout, shape, *, constrained: bool = False):
        """``layout`` split over the ``data`` axis too, along an axis the model axis leaves
        whole that the shape rule picks for the data groups (Keras's layouts name one mesh
        axis per array axis); as it was where none qualifies, or it is split so already."""
        axes = list(layout.axes)
        if AXIS in axes or self._groups == 1 or constrained or math.prod(shape) < MIN_ELEMENTS:
            return layout
        # shard_axis's rule (the first axis the count divides) over the axes left whole
        free = (d for d, (n, a) in enumerate(zip(shape, axes)) if a is None)
        at = next((d for d in free if shape[d] % self._groups == 0), None)
        if at is None:
            return layout
        axes[at] = AXIS
        return TensorLayout(axes, self.device_mesh)

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


def spread_slots(optimizer, placement) -> None:
    """Under ``shard="optimizer"`` on the 2-D mesh of ``placement``: each optimizer slot (made
    as its variable, split over the model axis) split over the data axis too, re-placed
    device to device."""
    grid = distribution(placement)
    if not isinstance(grid, GridSharded) or grid.shard != "optimizer":
        return
    for variable in optimizer.variables:
        layout = getattr(variable, "_layout", None)
        if not variable.shape or not isinstance(layout, TensorLayout):
            continue
        wider = grid.over_data(layout, variable.shape)
        if wider is not layout:
            variable._layout = wider  # noqa: SLF001 (Keras places a variable by it)
            variable.assign(variable.value)  # re-placed as the layout now says


def distribution(placement) -> Distribution | None:
    """The Keras distribution that creates variables on their shards under ``shard="all"``
    or ``model_parallel`` in one process; None elsewhere: the state is split for the step
    only (several workers: each process builds its model whole, split when the run
    starts)."""
    if getattr(placement, "model_parallel", 1) > 1:
        _load_onto_shards()
        return GridSharded(placement)
    if getattr(placement, "shard", "none") == "all" and placement.workers == 1:
        _load_onto_shards()
        return ShapeSharded(placement)
    return None


def _load_onto_shards() -> None:
    """From now on, a NumPy value assigned to a Keras variable that has a layout (what
    ``load_weights`` reads from a ``.weights.h5``, ``set_weights``' arrays) goes from the host
    into the variable's shards, each device getting its slice. Keras converts it first, whole,
    onto the default device, then splits it: a whole copy of every split weight on device 0
    while a model larger than one device loads. Variables without a layout are as Keras
    makes them. Idempotent."""
    if getattr(keras_jax.JaxVariable, "_mirrorfit_onto_shards", False):
        return
    convert = keras_jax.JaxVariable._convert_to_tensor

    def _convert_to_tensor(self, value, dtype=None):
        layout = getattr(self, "_layout", None)
        if (
            layout is None
            or type(value) is not np.ndarray  # a masked array, a matrix: as Keras takes them
            or value.shape != tuple(self.shape)  # Keras's own message names the shapes
            or not jax.dtypes.issubdtype(value.dtype, np.number)  # Keras's own conversion
            or jax.dtypes.issubdtype(value.dtype, np.complexfloating)
        ):
            return convert(self, value, dtype=dtype)
        sharding = layout.backend_layout if isinstance(layout, TensorLayout) else layout
        host = value.astype(jax.numpy.dtype(dtype or self.dtype), copy=False)
        return jax.device_put(host, sharding)

    keras_jax.JaxVariable._keras_convert_to_tensor = convert  # Keras's own, kept
    keras_jax.JaxVariable._convert_to_tensor = _convert_to_tensor
    keras_jax.JaxVariable._mirrorfit_onto_shards = True


__all__ = ["GridSharded", "ShapeSharded", "distribution", "spread_slots"]
