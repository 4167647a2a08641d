"""Data: locating and loading data sets (``mnist``), and the tf.data pipeline (``pipeline``)."""

from mirrorfit.data.mnist import Splits, load_mnist, locate_mnist
from mirrorfit.data.pipeline import eval_dataset, train_batches

__all__ = ["Splits", "load_mnist", "locate_mnist", "eval_dataset", "train_batches"]
