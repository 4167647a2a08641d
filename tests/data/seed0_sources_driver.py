"""Run by tests/data/test_sources.py: ``python seed0_sources_driver.py TFRECORDS BATCH``. Under
--seed 0 (keras.utils.set_random_seed(0): TF's global seed 0), reads 2 epochs of the TFRecord
files TFRECORDS (a glob) and of data_fixtures:dataset_source (cached in memory), global batch
BATCH. Prints one JSON line: the examples each gave."""

import json
import sys

import keras

from mirrorfit.data.sources import load_data

tfrecords, batch = sys.argv[1], int(sys.argv[2])
keras.utils.set_random_seed(0)
counts = {}
for name, spec, extra in (
    ("tfrecord", tfrecords, {}),
    ("module dataset", "data_fixtures:dataset_source", {"cache": "memory"}),
):
    data = load_data(spec, global_batch=batch, seed=0, **extra)
    counts[name] = sum(int(x.shape[0]) for x, _ in data.train.dataset(epochs=2))
print(json.dumps(counts))
