"""The Keras user's way in: ``mirrorfit.setup`` (engine, devices, precision, before the model
is built), ``mirrorfit.fit``, ``mirrorfit.evaluate`` and ``mirrorfit.predict`` (Keras's
``fit``/``evaluate``/``predict``, data-parallel). See docs/keras-script.md."""

from mirrorfit.fitting.loop import evaluate, fit
from mirrorfit.fitting.predict import predict
from mirrorfit.fitting.setup import Setup, setup

__all__ = ["Setup", "evaluate", "fit", "predict", "setup"]
