"""The Keras user's way in: ``mirrorfit.setup`` (engine, devices, precision, before the model
is built), ``mirrorfit.fit`` and ``mirrorfit.evaluate`` (Keras's ``fit``/``evaluate`` for a
compiled model, data-parallel). See docs/keras-script.md."""

from mirrorfit.fitting.loop import evaluate, fit
from mirrorfit.fitting.setup import Setup, setup

__all__ = ["Setup", "evaluate", "fit", "setup"]
