"""A script that builds its model before ``mirrorfit.setup``: run as ``python
late_setup_driver.py BACKEND`` (KERAS_BACKEND set to it); prints setup's one line."""

import sys

import keras

import mirrorfit

keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
try:
    mirrorfit.setup(backend=sys.argv[1], replicas=2)
except ValueError as e:
    print(f"REFUSED: {e}")
