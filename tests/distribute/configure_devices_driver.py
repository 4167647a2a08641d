"""Run by tests/distribute/test_host_memory.py: ``python configure_devices_driver.py MODE``.
The TensorFlow engine's configure_devices, with keep_freed_memory mocked: called plainly
(MODE ``default``) or with keep_freed_memory=True (``asked``), then once more with a request
it refuses. Prints the refusal's exception type, then how often keep_freed_memory was
called."""

import sys
from unittest import mock

from mirrorfit.distribute import _host_memory
from mirrorfit.engine.tensorflow import devices

with mock.patch.object(_host_memory, "keep_freed_memory") as keep:
    kwargs = {} if sys.argv[1] == "default" else {"keep_freed_memory": True}
    devices.configure_devices(**kwargs)
    try:  # a refused request changes nothing
        devices.configure_devices(replicas=2, devices=("/cpu:9",), **kwargs)
    except Exception as e:
        print(type(e).__name__)
print(keep.call_count)
