"""``python -m mirrorfit.cli``: the ``mirrorfit`` command (the tests run it so)."""

import sys

from mirrorfit.cli import main

sys.exit(main())
