"""Text from a trained language-model run: ``exogym sample RUN_DIR``.

A run folder written by ``exogym run`` holds ``config.json`` (with the task id) and ``model.pt``
(the global model at the last evaluation and at the end of the run, so a crashed run can be
sampled from its last checkpoint). :func:`sample` rebuilds the task's model, loads the weights,
and continues a prompt with :meth:`exogym.gpt.GPT.generate` (temperature, top-k, a seeded
generator: the same seed gives the same text). The character vocabulary comes from the task's
data, as in training.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from exogym.config import ConfigError
from exogym.gpt import GPT
from exogym.tasks import get_task

__all__ = ["load_run_model", "sample"]


def load_run_model(run_dir: str | os.PathLike[str]) -> tuple[str, torch.nn.Module]:
    """``(task id, model)`` of a run folder: the task's model with the run's ``model.pt``.

    Raises:
        FileNotFoundError: the folder has no ``config.json`` or no ``model.pt``.
        ConfigError: the run does not record its task (a run from the Python API without
            ``run_info={"task": ...}``), or the task is unknown.
    """
    run = Path(run_dir)
    config_path, weights = run / "config.json", run / "model.pt"
    for path in (config_path, weights):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist: RUN_DIR must be a run folder "
                                    "written by `exogym run` (it has config.json and model.pt)")
    task_id = json.loads(config_path.read_text()).get("task")
    if not task_id:
        raise ConfigError(f"{config_path} records no task; a Python-API run can record one "
                          'with Trainer.fit(..., run_info={"task": "shakespeare-char-gpt-v0"})')
    model = get_task(task_id).build_model()
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return task_id, model.eval()


@torch.no_grad()
def sample(
    run_dir: str | os.PathLike[str], *, prompt: str = "\n", max_new_tokens: int = 500,
    temperature: float = 0.8, top_k: int | None = 200, seed: int = 0,
    data_dir: str | os.PathLike[str] | None = None, download: bool = True,
) -> str:
    """The prompt followed by ``max_new_tokens`` characters sampled from a run's model.

    Args:
        run_dir: a language-model run folder (a ``shakespeare-char-gpt-*`` task).
        prompt: the text to continue; every character must be in the corpus's vocabulary.
        max_new_tokens: characters to generate (>= 1).
        temperature: > 0; below 1 sharpens the distribution, above 1 flattens it.
        top_k: sample among the ``top_k`` most likely characters only (None: all).
        seed: seeds the sampling generator.
        data_dir, download: where the task's corpus is (its vocabulary decodes the ids).
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not prompt:
        raise ValueError("prompt must have at least one character (default: a newline)")
    task_id, model = load_run_model(run_dir)
    if not isinstance(model, GPT):
        raise ConfigError(f"task {task_id!r} is not a language model; `sample` works with the "
                          "shakespeare-char-gpt-* tasks")
    train, _ = get_task(task_id).load_data(data_dir, download)
    vocab = train.vocab  # type: ignore[attr-defined]
    unknown = sorted(set(prompt) - set(vocab.chars))
    if unknown:
        raise ValueError(f"prompt has characters outside the corpus vocabulary: {unknown}")
    ids = vocab.encode(prompt).unsqueeze(0)
    generator = torch.Generator().manual_seed(seed)
    out = model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k,
                         generator=generator)
    return vocab.decode(out[0])
