"""The engine: per-replica step (``step``), compiled multi-step loops (``loop``), and the
controller that drives them (``trainer``)."""
