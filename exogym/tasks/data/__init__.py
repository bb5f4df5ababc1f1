"""The benchmark tasks' datasets: MNIST, CIFAR-10, Tiny Shakespeare, their download and checksums.

How a dataset is split among the nodes (shards, partitions) is the simulator's business:
:mod:`exogym.sim.sharding`, :mod:`exogym.sim.partition`.
"""
