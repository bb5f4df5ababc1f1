"""A stand-in for torchvision in tests (there is no CPU build of it here): what EXO Gym's
``example/mnist.py`` uses of it, ``datasets.MNIST`` served from ``$EXOGYM_DATA_DIR`` (no download)
and the ``transforms`` it composes. Not torchvision: only on the examples' test PYTHONPATH."""
