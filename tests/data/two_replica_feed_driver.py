"""Run by tests/data/test_files_cli.py: ``python two_replica_feed_driver.py FOLDER TFRECORDS
CHECKPOINT_DIR``. On 2 logical CPU replicas (a mirrored strategy), feeds epochs 0 and 1 of
the image folder FOLDER and of the TFRecord files TFRECORDS (a glob) through the trainer's own
input path, as the compiled step sees them (the host feed's batches cut per replica); then
trains one epoch on FOLDER with run_training, checkpointing to CHECKPOINT_DIR. Prints one
JSON line: per source and epoch, [steps, the sorted digests of every image seen], and "run":
[replicas, steps, training examples, validation accuracy]."""

import hashlib
import json
import sys

import mirrorfit
from mirrorfit.config import load_config
from mirrorfit.data.sources import load_data
from mirrorfit.engine.tensorflow.strategy import build_distribution

folder, tfrecords, checkpoint_dir = sys.argv[1:4]
setup = mirrorfit.configure_devices(replicas=2)
dist = build_distribution(setup, kind="mirrored")
seen = {}
for name, spec in (("folder", folder), ("tfrecord", tfrecords)):
    data = load_data(spec, global_batch=20, seed=3)
    for epoch in (0, 1):

        def make(w, n, data=data, epoch=epoch):  # this source's, this epoch's
            return data.train.dataset(start_epoch=epoch, epochs=epoch + 1, worker=w, workers=n)

        digests, steps = [], 0
        # as the compiled step sees it: the host feed's batches cut per replica
        for batch in dist.distribute(make, per_replica=10):
            steps += 1
            xb, yb = dist.strategy.run(lambda x, y: (x, y), args=dist.split(batch))
            for part in dist.strategy.experimental_local_results(xb):
                assert part.shape[0] == 10
                digests += [
                    hashlib.blake2b(
                        (a * 255).round().astype("uint8").tobytes(), digest_size=8
                    ).hexdigest()
                    for a in part.numpy()
                ]
        seen[f"{name} {epoch}"] = [steps, sorted(digests)]

from mirrorfit.job.train import run_training  # noqa: E402

config = load_config(
    data=folder,
    replicas=2,
    epochs=1,
    global_batch_size=20,
    progress=False,
    validation_split=0.1,
    optimizer="adam",
    lr=0.003,
    checkpoint_dir=checkpoint_dir,
)
summary = run_training(config)
seen["run"] = [
    summary["replicas"],
    summary["steps"],
    summary["train_examples"],
    summary["val_accuracy"],
]
print(json.dumps(seen))
