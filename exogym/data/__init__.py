"""Datasets, their download and verification, per-node sharding and partitioning."""

from exogym.data.partition import Partition, parse_partition
from exogym.data.sharding import BatchDataset, DatasetFactory, NodeBatches, fetch, iterate_batches

__all__ = [
    "BatchDataset", "DatasetFactory", "NodeBatches", "Partition", "fetch", "iterate_batches",
    "parse_partition",
]
