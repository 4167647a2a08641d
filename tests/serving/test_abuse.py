"""A hostile client against a real `mirrorfit serve` process (issue 10, items 1-7).

Every answer to a bad request is TF Serving's own: a 4xx over REST, INVALID_ARGUMENT (or the
code TF Serving uses) over gRPC, with a message naming the bad value. The server's resources
(threads, memory, batch queues, metric series) stay bounded whatever the client sends, it stays
ready, and no traceback reaches its stderr.
"""

from __future__ import annotations

import pytest

from serving_support import Server, model_root  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


# --- gRPC, batching and version polling (items 1, 2, 5 for gRPC, 6, 7) -------------------------


# --- REST transport, limits and metrics (items 3, 4, 5 for REST) -------------------------------
