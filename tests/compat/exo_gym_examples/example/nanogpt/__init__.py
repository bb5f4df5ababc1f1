# simulator/__init__.py

from .build_dataset import build_dataset_small, build_dataset_owt
from .dataset import get_dataset
from .nanogpt import GPT, GPTConfig

__all__ = ["get_dataset", "build_dataset_small", "build_dataset_owt", "GPT", "GPTConfig"]
