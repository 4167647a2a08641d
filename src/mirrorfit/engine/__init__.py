"""The engine: the controller shared by every backend (``controller``: epochs, hooks, progress,
the training Position) and one package per backend for what runs on the devices
(``tensorflow``: devices, strategy, per-replica step, compiled loops, runner)."""
