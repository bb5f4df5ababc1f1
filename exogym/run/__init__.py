"""One training run: the trainer's loop, its result and metrics sinks, and the same run as real
processes (launch, torch.distributed)."""
