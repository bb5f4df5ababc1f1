"""Text from a trained language-model run: ``exogym sample RUN_DIR``.

A run folder written by ``exogym run`` holds ``config.json`` (with the task id) and ``model.pt``
(the global model at the last evaluation and at the end of the run, so a crashed run can be
sampled from its last checkpoint). :func:`sample` rebuilds the task's model, loads the weights,
and continues a prompt with :meth:`exogym.tasks.gpt.GPT.generate` (temperature, top-k, a seeded
generator: the same seed gives the same text). The character vocabulary is the one recorded in
``config.json`` (``"vocab"``, written by every run of a GPT task), so no corpus is needed; a run
folder without it (written before exogym recorded it) rebuilds it from the task's data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from exogym.run.output.result import read_json
from exogym.tasks.data.shakespeare import CharVocab
from exogym.tasks.gpt import GPT
from exogym.tasks.registry import get_task
from exogym.utils.config import ConfigError

__all__ = ["load_run_model", "read_run_config", "sample"]


def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A run folder's ``config.json`` (errors name the file: :func:`exogym.run.output.result.
    read_json`)."""
    return read_json(Path(run_dir) / "config.json",
                     "RUN_DIR must be a run folder written by `exogym run` (it has config.json "
                     "and model.pt)")


def load_run_model(run_dir: str | os.PathLike[str]) -> tuple[str, torch.nn.Module]:
    """``(task id, model)`` of a run folder: the task's model with the run's ``model.pt``.

    Raises:
        FileNotFoundError: the folder has no ``config.json`` or no ``model.pt``.
        ValueError: one of them is corrupted or does not fit the task's model (naming the file).
        ConfigError: the run does not record its task (a run from the Python API without
            ``run_info={"task": ...}``), or the task is unknown.
    """
    run = Path(run_dir)
    config = read_run_config(run)
    weights = run / "model.pt"
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} does not exist: RUN_DIR must be a run folder "
                                "written by `exogym run` (it has config.json and model.pt)")
    task_id = config.get("task")
    if not task_id:
        raise ConfigError(f"{run / 'config.json'} records no task; a Python-API run can record "
                          'one with Trainer.fit(..., run_info={"task": "shakespeare-char-gpt-v0"})')
    model = get_task(task_id).build_model()
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as err:  # pickle, zip and size errors all mean: not this model's weights
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{weights} cannot be loaded as the {task_id} model's weights "
                         f"(truncated or corrupted?): {first}") from None
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
        data_dir: where the task's corpus is, needed only for a run folder that does not
            record its vocabulary.
        download: whether that corpus may be downloaded.
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
    recorded = read_run_config(run_dir).get("vocab")
    if isinstance(recorded, str) and recorded:
        vocab = CharVocab(recorded)
    else:  # a run folder from before the vocabulary was recorded: rebuild it from the corpus
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
