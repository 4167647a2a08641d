"""Which ``--model`` names exist and which input shapes they take, in plain Python.

The configuration checks ``--model`` and ``--input-shape`` with this module before TensorFlow
loads (seconds), so a typo costs no start-up; :mod:`mirrorfit.models.build` builds the models.
"""

from __future__ import annotations

import difflib

from mirrorfit.errors import ConfigError

REFERENCE = ("mlp", "cnn")  # the chapter's models, mirrorfit.models.REFERENCE_MODELS

# keras.applications architectures, spelled as Keras spells them (Keras 3.15; a test checks
# the list against keras.applications, so a Keras upgrade that adds one is noticed).
APPLICATIONS = (
    "ConvNeXtBase",
    "ConvNeXtLarge",
    "ConvNeXtSmall",
    "ConvNeXtTiny",
    "ConvNeXtXLarge",
    "DenseNet121",
    "DenseNet169",
    "DenseNet201",
    "EfficientNetB0",
    "EfficientNetB1",
    "EfficientNetB2",
    "EfficientNetB3",
    "EfficientNetB4",
    "EfficientNetB5",
    "EfficientNetB6",
    "EfficientNetB7",
    "EfficientNetV2B0",
    "EfficientNetV2B1",
    "EfficientNetV2B2",
    "EfficientNetV2B3",
    "EfficientNetV2L",
    "EfficientNetV2M",
    "EfficientNetV2S",
    "InceptionResNetV2",
    "InceptionV3",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Large",
    "MobileNetV3Small",
    "NASNetLarge",
    "NASNetMobile",
    "ResNet101",
    "ResNet101V2",
    "ResNet152",
    "ResNet152V2",
    "ResNet50",
    "ResNet50V2",
    "VGG16",
    "VGG19",
    "Xception",
)

# Smallest height and width in pixels each architecture accepts (Keras's ``min_size``): the
# Inception family and Xception reduce more before their first pooling than the others' 32.
_MIN_SIZE = {"InceptionV3": 75, "InceptionResNetV2": 75, "Xception": 71}
# Height and width Keras builds them at when no shape is given (ImageNet's).
_DEFAULT_SIZE = {
    "InceptionV3": 299,
    "InceptionResNetV2": 299,
    "Xception": 299,
    "NASNetLarge": 331,
    "EfficientNetB1": 240,
    "EfficientNetB2": 260,
    "EfficientNetB3": 300,
    "EfficientNetB4": 380,
    "EfficientNetB5": 456,
    "EfficientNetB6": 528,
    "EfficientNetB7": 600,
    "EfficientNetV2B1": 240,
    "EfficientNetV2B2": 260,
    "EfficientNetV2B3": 300,
    "EfficientNetV2S": 384,
    "EfficientNetV2M": 480,
    "EfficientNetV2L": 480,
}
IMAGENET_CLASSES = 1000


def is_application(spec: str) -> bool:
    """Whether ``spec`` names a keras.applications architecture (exact Keras spelling)."""
    return spec in APPLICATIONS


def min_size(name: str) -> int:
    """Smallest input height and width in pixels for application ``name``."""
    return _MIN_SIZE.get(name, 32)


def default_input_shape(name: str) -> tuple[int, int, int]:
    """(height, width, channels) Keras builds application ``name`` at by default (ImageNet's)."""
    size = _DEFAULT_SIZE.get(name, 224)
    return (size, size, 3)


def check_model_name(spec: str) -> None:
    """Raise ConfigError unless ``spec`` is ``mlp``, ``cnn``, a keras.applications name or
    ``package.module:function``; a near miss (``resnet50``, ``MobilenetV2``) is suggested."""
    if spec in REFERENCE or spec in APPLICATIONS or ":" in spec:
        return
    raise ConfigError(
        f"unknown model {spec!r}{_suggestion(spec)}; use mlp, cnn, a "
        "keras.applications name (ResNet50, MobileNetV2, EfficientNetB0, ...) or "
        "package.module:function"
    )


def built_in_named(name: object) -> str | None:
    """The built-in ``--model`` named ``name`` in any letter case (``mlp``, ``cnn``, an
    application: ``ResNet50``, or its Keras model's name ``resnet50``), or None."""
    by_lower = {n.lower(): n for n in REFERENCE + APPLICATIONS}
    return by_lower.get(name.lower()) if isinstance(name, str) else None


def _suggestion(spec: str) -> str:
    # Case-blind: "resnet50" is one letter case away from ResNet50, which difflib would
    # score as five edits.
    by_lower = {n.lower(): n for n in REFERENCE + APPLICATIONS}
    close = difflib.get_close_matches(spec.lower(), list(by_lower), n=1, cutoff=0.75)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def check_input_shape(
    spec: str, input_shape: tuple[int, ...] | None, *, flag: str = "--input-shape"
) -> None:
    """Raise ConfigError, naming ``flag`` and a valid value, if application ``spec`` cannot be
    built for ``input_shape`` (height, width, channels in pixels; None: its default). Other
    models are not checked here: their builders say what they need."""
    if not is_application(spec) or input_shape is None:
        return
    smallest = min_size(spec)
    example = f"{flag} {max(smallest, 32)},{max(smallest, 32)},3"
    shown = ",".join(str(d) for d in input_shape)
    if len(input_shape) != 3:
        raise ConfigError(
            f"{flag} {shown}: --model {spec} takes images as height,width,"
            f"channels (3 numbers), got {len(input_shape)}; e.g. {example}"
        )
    height, width, channels = input_shape
    if min(input_shape) < 1:
        raise ConfigError(f"{flag} {shown}: sizes must be positive; e.g. {example}")
    if height < smallest or width < smallest:
        raise ConfigError(
            f"{flag} {shown}: --model {spec} needs images of at least "
            f"{smallest}x{smallest} pixels; e.g. {example}"
        )


__all__ = [
    "APPLICATIONS",
    "REFERENCE",
    "IMAGENET_CLASSES",
    "check_input_shape",
    "check_model_name",
    "default_input_shape",
    "is_application",
    "min_size",
]
