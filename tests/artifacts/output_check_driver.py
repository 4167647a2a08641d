"""Run by tests/artifacts/test_output_paths.py (as a user whom permissions apply to):
``python output_check_driver.py CHECK FLAG PATH``. Calls
``mirrorfit.artifacts.output_paths.CHECK(FLAG, PATH)``; prints its ConfigError's message
(nothing: accepted)."""

import sys

from mirrorfit.artifacts import output_paths
from mirrorfit.errors import ConfigError

try:
    getattr(output_paths, sys.argv[1])(sys.argv[2], sys.argv[3])
except ConfigError as e:
    print(e)
