"""EXO Gym's ``exogym.aux`` (an alias of this package, :mod:`exogym._aliases`: a folder named
``aux`` cannot exist on Windows): of its helpers, :mod:`.utils`'s ``get_device``, which EXO Gym's
examples import. Its loggers, checkpoint and correlation mixins are not provided: exogym's run
loop, sinks and checkpoints do that work (docs/from-exo-gym.md).
"""
