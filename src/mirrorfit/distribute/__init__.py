"""Where training runs: local devices, the tf.distribute strategy, the cluster of processes and hosts, and the local launcher."""
