"""Run by tests/models/test_build.py: ``python config_names_driver.py``. TrainConfig takes a
keras.applications name (ResNet50) and refuses a misspelt one; prints the refusal, then
whether TensorFlow was imported by then (it must not be)."""

import sys

from mirrorfit.config import TrainConfig

TrainConfig(model="ResNet50")
try:
    TrainConfig(model="resnet50")
except Exception as e:
    print(e)
print("tensorflow" in sys.modules)
