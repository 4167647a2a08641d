"""Run by tests/data/test_mnist.py (as a user whom permissions apply to): ``python
locate_mnist_driver.py DIR``. Looks for MNIST in DIR (as --data-dir DIR), then by the
program's own search (no --data-dir), without downloading; prints each refusal's message."""

import sys

from mirrorfit.data.mnist import locate_mnist

for d in (sys.argv[1], None):
    try:
        locate_mnist(d, download=False)
    except Exception as e:
        print(e)
