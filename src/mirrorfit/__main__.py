"""``python -m mirrorfit``: the ``mirrorfit`` command (``mirrorfit launch`` starts tasks so, to
run the launcher's own installation)."""

from mirrorfit.cli import run

run()
