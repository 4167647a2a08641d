"""``python -m mirrorfit.cli``: the ``mirrorfit`` command (the tests run it so)."""

from mirrorfit.cli import run

run()
