"""The models ``--model`` names: the chapter's MLP and CNN, any keras.applications architecture
(random initial weights), and a user's ``package.module:function``. Builders return uncompiled
models, for the caller to build under ``strategy.scope()`` and the precision policy
(:meth:`mirrorfit.models.precision.Precision.building`). Which names exist, and the shapes they
take: :mod:`mirrorfit.models.names` (plain Python, checked before TF loads).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

import keras

from mirrorfit._frameworks import tensorflow_start_filtered
from mirrorfit.errors import ConfigError, FitError
from mirrorfit.models.names import (
    IMAGENET_CLASSES,
    check_input_shape,
    check_model_name,
    default_input_shape,
    is_application,
)

MNIST_SHAPE = (28, 28)


def mlp(input_shape: tuple[int, ...] = MNIST_SHAPE, num_classes: int = 10) -> keras.Model:
    """Flatten -> Dense(100, relu) -> Dense(10, softmax), as in chapter 19."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(100, activation="relu"),
            # float32 output under mixed precision too: a softmax in bf16/fp16 loses the small
            # probabilities the loss needs.
            keras.layers.Dense(num_classes, activation="softmax", dtype="float32"),
        ],
        name="mlp",
    )


def cnn(input_shape: tuple[int, ...] = MNIST_SHAPE, num_classes: int = 10) -> keras.Model:
    """The chapter's CNN: Conv(64,7) -> Pool -> Conv(128,3) x2 -> Pool -> Dense(64) -> Dropout.

    ``input_shape``: (height, width) for one-channel images such as MNIST's, or (height,
    width, channels)."""
    input_shape = tuple(input_shape)
    _check_cnn_input(input_shape)
    # Grey images come without a channel axis; Conv2D needs one. Images with channels get no
    # Reshape, so the layers for MNIST (and its checkpoints) stay as they were.
    channels = [keras.layers.Reshape(input_shape + (1,))] if len(input_shape) == 2 else []
    return keras.Sequential(
        [
            keras.Input(input_shape),
            *channels,
            keras.layers.Conv2D(64, 7, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(num_classes, activation="softmax", dtype="float32"),
        ],
        name="cnn",
    )


CNN_SMALLEST = 4  # pixels a side: two 2x2 poolings leave one pixel of a 4x4 image


def taking_pixels(model: keras.Model, shape: tuple[int, ...] | None = None) -> keras.Model:
    """``model`` (on float32 images in [0, 1]) behind a scaling by 1/255: it takes uint8
    pixels as they are stored, scaled where it runs, not a float32 copy of the data in memory
    (four times its bytes). ``shape``: one example's, for a model without a keras.Input (its
    own otherwise). No weight of its own: its weights are ``model``'s (the last layer,
    :func:`inner_model`)."""
    try:
        shape = tuple(model.inputs[0].shape[1:])
    except (AttributeError, IndexError, TypeError, ValueError):  # subclassed: no inputs
        if shape is None:
            raise
    pixels = keras.Input(shape, dtype="uint8", name="pixels")
    scaled = _Scaled(name="scaled")(pixels)
    return keras.Model(pixels, model(scaled), name=model.name)


class _Scaled(keras.layers.Layer):
    """uint8 pixels / 255 in the layer's compute dtype. Not Keras's Rescaling: a tf.data
    layer, which asks TensorFlow whether it runs in a graph where TensorFlow is importable
    (and fails where its import is blocked, as on a JAX-only machine's tests)."""

    def call(self, x):
        return keras.ops.cast(x, self.compute_dtype) / 255.0

    def compute_output_shape(self, input_shape):
        return input_shape


def with_inputs(model: keras.Model, shape: tuple[int, ...]) -> keras.Model:
    """``model``, or where it declares no inputs (a subclassed model) a functional model of
    it on ``keras.Input(shape)``: what an export reads its signature from."""
    try:
        model.inputs[0]
        return model
    except (AttributeError, IndexError, TypeError, ValueError):
        x = keras.Input(shape)
        return keras.Model(x, model(x), name=model.name)


def inner_model(model: keras.Model) -> keras.Model:
    """The model :func:`taking_pixels` wrapped (its variables), for an export or scoring on
    [0, 1] images."""
    return model.layers[-1]


def _check_cnn_input(shape: tuple[int, ...]) -> None:
    """FitError (a ValueError, one line) for examples the CNN cannot take: not images, or
    smaller than 4x4 pixels (Keras's "output size would be zero or negative" otherwise)."""
    if len(shape) not in (2, 3):
        raise FitError(
            f"--model cnn takes images, (height, width) or (height, width, "
            f"channels); these examples have shape {shape}: use --model mlp"
        )
    if min(shape[:2]) < CNN_SMALLEST:
        raise FitError(
            f"--model cnn takes images of at least {CNN_SMALLEST}x{CNN_SMALLEST} "
            f"pixels (it pools twice by 2); these are {shape[0]}x{shape[1]}: give "
            f"--image-size {CNN_SMALLEST},{CNN_SMALLEST} or larger (--input-shape "
            "for synthetic data), or use --model mlp"
        )


# names.REFERENCE (and config.MODELS) hold the same names, to check --model before Keras
# loads (tests/test_models.py)
REFERENCE_MODELS: dict[str, Callable[..., keras.Model]] = {"mlp": mlp, "cnn": cnn}


def model_factory(
    spec: str, *, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None
) -> Callable[[], keras.Model]:
    """A zero-argument function building the model ``spec`` names: ``mlp``, ``cnn``, a
    keras.applications name (``ResNet50``) or ``package.module:function``. ``input_shape`` (one
    example, no batch axis), ``num_classes``: None keeps the model's own (MNIST's (28, 28) and 10;
    an application's ImageNet size, 3 channels, 1000); a user function gets them as keywords if it
    takes them (or ``**kwargs``). Bad names, imports or shapes: ConfigError, before building.
    """
    check_model_name(spec)
    if spec in REFERENCE_MODELS:
        build_reference = REFERENCE_MODELS[spec]
        kwargs = _given(input_shape=input_shape, num_classes=num_classes)
        return lambda: build_reference(**kwargs)
    if is_application(spec):
        return _application(spec, input_shape=input_shape, num_classes=num_classes)
    return _user_model(spec, input_shape=input_shape, num_classes=num_classes)


def _given(**values) -> dict:
    return {k: (tuple(v) if k == "input_shape" else v) for k, v in values.items() if v is not None}


def _application(
    name: str, *, input_shape: tuple[int, ...] | None, num_classes: int | None
) -> Callable[[], keras.Model]:
    """keras.applications.<name> with random weights and its classifier on top, taking float
    images in [0, 1] as mirrorfit's pipelines give them."""
    shape = tuple(input_shape) if input_shape is not None else default_input_shape(name)
    check_input_shape(name, shape)
    classes = num_classes or IMAGENET_CLASSES
    builder = getattr(keras.applications, name)
    options = dict(
        weights=None,
        include_top=True,
        classes=classes,
        input_shape=shape,
        classifier_activation=None,
    )
    # Keras's built-in preprocessing (ConvNeXt, EfficientNetV2, MobileNetV3) expects pixels in
    # [0, 255]; ours are already scaled to [0, 1]. (EfficientNetB0-B7 always rescale by 1/255:
    # their first batch normalisation absorbs the scale.)
    if "include_preprocessing" in inspect.signature(builder).parameters:
        options["include_preprocessing"] = False

    def build() -> keras.Model:
        try:
            base = builder(**options)
        except ValueError as e:  # a constraint models.names does not know of: still one line
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(
                f"--model {name} cannot be built for --input-shape "
                f"{','.join(map(str, shape))} ({first})"
            ) from None
        # Logits in the compute dtype, softmax in float32: under bf16/fp16 a low-precision
        # softmax rounds the small probabilities the loss needs (as the reference models do).
        probabilities = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(
            base.output
        )
        return keras.Model(base.input, probabilities, name=base.name)

    return build


def _user_model(
    spec: str, *, input_shape: tuple[int, ...] | None, num_classes: int | None
) -> Callable[[], keras.Model]:
    module_name, _, attr = spec.partition(":")
    try:
        with tensorflow_start_filtered():  # a model module may import TensorFlow
            module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # ImportError, or the module's own code failing
        raise ConfigError(
            f"cannot import module {module_name!r} for --model {spec!r} "
            f"({type(e).__name__}: {_first_line(e)}); is it on PYTHONPATH?"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"module {module_name!r} has no function {attr!r} for --model {spec!r}")
    kwargs = _accepted(fn, _given(input_shape=input_shape, num_classes=num_classes))

    def build() -> keras.Model:
        try:
            model = fn(**kwargs)
        except SystemExit as e:  # no Exception: it would end the run with its code, no line
            raise ConfigError(
                f"--model {spec!r}: the function exited (SystemExit: {e.code}) "
                "instead of returning a keras.Model"
            ) from None
        except Exception as e:
            raise ConfigError(
                f"--model {spec!r}: the function raised {type(e).__name__}: {_first_line(e)}"
            ) from None
        if not isinstance(model, keras.Model):
            raise ConfigError(
                f"--model {spec!r} returned {type(model).__name__}, not a keras.Model"
            )
        return model

    return build


def needs_data_shape(spec: str, input_shape, num_classes) -> bool:
    """Whether a ``--model package.module:function`` has a required ``input_shape`` or
    ``num_classes`` parameter the flags do not give (mirrorfit passes the data's then); a
    built-in model's have defaults."""
    if ":" not in spec:
        return False
    module_name, _, attr = spec.partition(":")
    try:
        with tensorflow_start_filtered():
            fn = getattr(importlib.import_module(module_name), attr, None)
        params = inspect.signature(fn).parameters
    except Exception:  # noqa: BLE001 - the usual path reports import problems in one line
        return True
    given = _given(input_shape=input_shape, num_classes=num_classes)
    return any(
        p.default is inspect.Parameter.empty
        and name in ("input_shape", "num_classes")
        and name not in given
        for name, p in params.items()
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else "no message"


def _accepted(fn: Callable, kwargs: dict) -> dict:
    """The keyword arguments of ``kwargs`` that ``fn`` takes (a zero-argument function, as
    before input shapes existed, gets none)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}
