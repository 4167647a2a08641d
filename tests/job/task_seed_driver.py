"""Run by tests/job/test_agreement.py as the command `mirrorfit launch` starts:
``python task_seed_driver.py ARGS``. mirrorfit's CLI on ARGS plus ``--seed`` from the task's
own TF_CONFIG: 1 on worker 0, 2 on worker 1, so that the workers disagree on it."""

import json
import os
import sys

from mirrorfit.cli import run

task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
sys.argv[1:] = sys.argv[1:] + ["--seed", str(task + 1)]
run()
