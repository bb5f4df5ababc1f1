"""A stand-in for Hugging Face ``datasets`` in tests: EXO Gym's ``example/nanogpt`` imports it at
module level, but reads Tiny Shakespeare from its cache (``data/shakespeare_char/*.npy``), which
the test writes first from ``$EXOGYM_DATA_DIR``; a call here means the cache was missed."""

from __future__ import annotations

from typing import Any


def _no_download(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"no dataset download in tests (asked for {args} {kwargs}): the test "
                       "writes the example's data cache (data/shakespeare_char/*.npy) first")


load_dataset = load_dataset_builder = concatenate_datasets = _no_download
