"""Run by tests/distribute/test_host_memory.py, each case in a fresh process (malloc settings
are process-wide): ``python memory_probe_driver.py MODE``. MODE ``keep`` calls
keep_freed_memory(), ``default`` leaves glibc's default, ``train`` runs a tiny training run
first (it asks for the setting itself). Then a thread (its own malloc arena, as a training
step's) allocates and frees buffers of mixed sizes, 12 passes. Prints what keep_freed_memory()
returned (None, or "ran" after training) and the median page faults of a pass after the
first two."""

import resource
import sys
import threading

import numpy as np

from mirrorfit.distribute._host_memory import keep_freed_memory

if sys.argv[1] == "train":
    from mirrorfit.config import load_config
    from mirrorfit.job.train import run_training

    run_training(
        load_config(model="mlp", epochs=1, train_examples=256, global_batch_size=64, progress=False)
    )
    applied = "ran"
else:
    applied = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []


def passes():
    for _ in range(12):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        buffers = [np.ones(mib << 18, np.float32) for mib in (3, 12, 5, 20, 1, 9)]  # MiB
        del buffers
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)


thread = threading.Thread(target=passes)
thread.start()
thread.join()
print(applied, sorted(faults[2:])[len(faults[2:]) // 2])  # the median pass after warm-up
