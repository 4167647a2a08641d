"""What `mirrorfit train` (and ``run_training``) checks before any framework loads: the cluster
this task belongs to (TF_CONFIG, SLURM), where the run writes (on the chief), and that this
task's own port is free. Plain Python: a bad setting costs no start-up."""

from __future__ import annotations

from mirrorfit.config import TrainConfig, check_outputs
from mirrorfit.distribute.cluster import Cluster, cluster_for


def check_run(config: TrainConfig) -> Cluster | None:
    """This task's cluster (None for a one-process run), after the checks; ConfigError, one
    line, for a malformed cluster, an output path that cannot be written, or a port in use."""
    cluster = cluster_for(config.strategy)
    if cluster is None or cluster.is_chief:  # fail before any work: bad input writes nothing
        check_outputs(config)
    if cluster is not None:  # this task's own port taken: one line now, not a wait and a peer
        from mirrorfit.distribute._listen import prepare  # blamed (the strategy checks again)

        prepare(cluster)
    return cluster


__all__ = ["check_run"]
