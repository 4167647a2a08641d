"""The models ``--model`` names: ``names`` (which exist and the shapes they take; plain Python,
checked before the backend loads), ``build`` (the chapter's MLP and CNN, keras.applications, a
user's function), ``precision`` and learning-rate ``schedules``. ``mlp`` / ``cnn`` /
``model_factory`` load Keras on first use (PEP 562), so the CLI can check ``--model`` first.
"""

import importlib

_EXPORTS = {"mlp": "build", "cnn": "build", "model_factory": "build", "REFERENCE_MODELS": "build"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mirrorfit.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mirrorfit.models.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
