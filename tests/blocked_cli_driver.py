"""Run by tests (conftest.run_cli, and a few as the command `mirrorfit launch` starts):
``python blocked_cli_driver.py MODULES ARGS``. mirrorfit's CLI (``cli.main(ARGS)``) in a
process where importing each of MODULES, comma-separated top-level names such as
``tensorflow,jax``, fails: an error that still comes back as mirrorfit's one line was found
before those load, and a run that trains needs none of them."""

import sys

sys.modules.update(dict.fromkeys(sys.argv[1].split(",")))

from mirrorfit.cli import main  # noqa: E402

sys.exit(main(sys.argv[2:]))
