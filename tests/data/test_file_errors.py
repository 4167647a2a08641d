"""mirrorfit.data.file_errors: tf.data's errors about a source's files, as one line."""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

from mirrorfit.data.file_errors import data_errors
from mirrorfit.data.sources import load_data
from mirrorfit.errors import DataError


@pytest.fixture(scope="module")
def data():
    return load_data(
        "synthetic", global_batch=8, input_shape=(4, 4, 1), num_classes=3, train_examples=32
    )


def test_a_file_gone_while_training_is_one_line_naming_the_source(data):
    folder = dataclasses.replace(data, kind="folder", source="/data/photos")
    with pytest.raises(
        DataError,
        match=r"--data /data/photos: a file went missing while "
        r"training \(/data/photos/a/1.png; no such file\)",
    ):
        with data_errors(folder):
            raise tf.errors.NotFoundError(None, None, "/data/photos/a/1.png; no such file\nmore")
    # data held in memory has no files to lose, and an error no source explains stays as it is
    with pytest.raises(tf.errors.NotFoundError):
        with data_errors(data):
            raise tf.errors.NotFoundError(None, None, "gone")
    with pytest.raises(tf.errors.InvalidArgumentError):
        with data_errors(data):
            raise tf.errors.InvalidArgumentError(None, None, "bad")
