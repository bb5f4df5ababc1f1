"""What makes N nodes on one machine: the node-stacked engine, the communicator and its codecs,
the simulated network and clock, and each node's data (shards, partitions)."""
