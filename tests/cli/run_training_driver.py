"""Run by tests/cli/test_cli.py: ``python run_training_driver.py METRICS_OUT``. Trains through
``mirrorfit.job.train.run_training`` (the library's way in, not the CLI's) with
``metrics_out=METRICS_OUT``; prints ``refused:`` and the ConfigError's message if the run
refuses it."""

import sys

from mirrorfit.config import load_config
from mirrorfit.errors import ConfigError
from mirrorfit.job.train import run_training

try:
    run_training(load_config(metrics_out=sys.argv[1], epochs=1, train_examples=64))
except ConfigError as e:
    print("refused:", e)
