"""Datasets, their download and verification, and per-node sharding."""

from exogym.data.sharding import BatchDataset, DatasetFactory, NodeBatches, fetch, iterate_batches

__all__ = ["BatchDataset", "DatasetFactory", "NodeBatches", "fetch", "iterate_batches"]
