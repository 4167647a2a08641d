"""Where training runs across processes and hosts, in plain Python: the cluster of tasks
(TF_CONFIG, SLURM), the local launcher, where each task listens, and the host-side settings of a
training process."""
