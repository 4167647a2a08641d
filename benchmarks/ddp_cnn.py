"""The chapter's CNN in PyTorch with DistributedDataParallel (gloo): the PyTorch side of
``benchmarks/multi_worker.py``, on the same examples, batch, order and steps as ``mirrorfit
train --model cnn``.

Run by that benchmark with an interpreter that has PyTorch (``--torch-python``; PyTorch is no
dependency of mirrorfit): one process per rank, ``RANK``, ``WORLD_SIZE`` and ``MASTER_PORT`` in
its environment, each bound to its cores by the benchmark as ``mirrorfit launch`` binds its
workers. Needs only PyTorch and NumPy (not mirrorfit).

What matches mirrorfit's run: MNIST's first N training examples scaled to [0, 1]; each epoch
the permutation ``numpy.random.default_rng([seed, epoch])`` cut into global batches (the
remainder dropped), rank r reading the r-th contiguous share of each; the same layers
(Conv 64 7x7 same, max pool, Conv 128 3x3 same x2, max pool, Dense 64, Dropout 0.5, Dense
10); SGD at the same learning rate on the mean loss of the global batch (DDP averages the
ranks' gradients: one all-reduce per step, in buckets); ``threads`` intra-op threads per rank.
Throughput: the global examples of every step after the first ``--skip`` steps (mirrorfit
excludes its first compiled execution: ``--steps-per-execution`` steps), over the seconds
those steps took (input, forward, backward and all-reduce, update; no validation), on rank 0.

    python benchmarks/ddp_cnn.py --data-dir ../shared/data --out r.json  (one rank alone)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 64, 7, padding=3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(64, 128, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(128, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128 * 7 * 7, 64),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(64, 10),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", required=True)
    p.add_argument("--out", required=True, help="rank 0 writes its summary (JSON) here")
    p.add_argument("--global-batch-size", type=int, default=64)
    p.add_argument("--train-examples", type=int, default=6400)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--skip", type=int, default=25, help="steps left out of the throughput")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
            rank=rank,
            world_size=world,
        )
    with np.load(os.path.join(a.data_dir, "mnist.npz")) as f:
        x, y = f["x_train"][: a.train_examples], f["y_train"][: a.train_examples]
        x_test, y_test = f["x_test"], f["y_test"]
    torch.manual_seed(a.seed)
    model = cnn()
    trained = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimizer = torch.optim.SGD(trained.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    steps = len(x) // a.global_batch_size
    share = a.global_batch_size // world
    pixels = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    labels = torch.from_numpy(y.astype(np.int64))
    done, seconds = 0, 0.0
    trained.train()
    for epoch in range(a.epochs):
        order = np.random.default_rng([a.seed, epoch]).permutation(len(x))
        rows = order[: steps * a.global_batch_size].reshape(steps, a.global_batch_size)
        for step in range(steps):
            t0 = time.perf_counter()
            index = torch.from_numpy(rows[step, rank * share : (rank + 1) * share])
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(trained(pixels[index]), labels[index])
            loss.backward()  # DDP: the all-reduce of the gradients, overlapped with it
            optimizer.step()
            if done >= a.skip:
                seconds += time.perf_counter() - t0
            done += 1
    if world > 1:
        dist.barrier()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            right = 0
            for start in range(0, len(x_test), 1000):
                batch = torch.from_numpy(x_test[start : start + 1000].astype(np.float32) / 255.0)
                right += int(
                    (
                        model(batch.unsqueeze(1)).argmax(1).numpy() == y_test[start : start + 1000]
                    ).sum()
                )
        timed = (done - a.skip) * a.global_batch_size
        with open(a.out, "w") as f:
            json.dump(
                {
                    "train_examples_per_sec": timed / seconds if seconds else 0.0,
                    "test_accuracy": right / len(x_test),
                    "steps": done,
                    "workers": world,
                    "torch": torch.__version__,
                },
                f,
            )
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
