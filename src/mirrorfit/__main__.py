"""``python -m mirrorfit``: the ``mirrorfit`` command (``mirrorfit launch`` starts tasks so, to
run the launcher's own installation)."""

import sys

from mirrorfit.cli import main

sys.exit(main())
