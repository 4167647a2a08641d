"""The training job, as ``mirrorfit train`` runs it: ``train`` (config -> devices -> strategy ->
data -> trainer -> summary), ``data`` (the run's --data), ``finish`` (test, summary, exports),
``preemption`` (SIGTERM -> save -> exit 75), ``observe`` and ``profiling`` (watching a run)."""
