"""The TensorFlow engine, in the order a run uses it: ``devices`` (GPUs, logical CPU devices,
thread pools) -> ``strategy`` (tf.distribute by name, as one ``distribution.Distribution``;
``parameter_server`` for ParameterServerStrategy) -> ``step`` (what each replica runs) ->
``loop`` (S steps in one tf.function) -> ``runner`` (everything built under the strategy)."""
