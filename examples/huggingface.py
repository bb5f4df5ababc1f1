"""A Hugging Face model and dataset as they are: a GPT-2-shaped ``transformers`` model, randomly
initialised from a config (nothing downloaded), on a ``datasets.Dataset`` of Tiny Shakespeare's
characters, under DDP and DiLoCo.

Nothing is wrapped: the dataset's rows are dicts (``input_ids``, ``labels``), which exogym
passes to the model as keyword arguments (``model(**batch)``, as a Hugging Face training loop
does), and the loss is the model output's ``loss``; the step's FLOPs are counted as any model's.
``pip install -e ".[hf]"``, then::

    python examples/huggingface.py --steps 300                    # the simulator, ~2 min
    python examples/huggingface.py --steps 300 --engine process   # one process per node
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from transformers import GPT2Config, GPT2LMHeadModel

from exogym import Trainer
from exogym.run.launch import fit_processes
from exogym.run.output.result import check_out_dir
from exogym.strategy import make
from exogym.tasks.data.shakespeare import CharVocab, read_text


def char_datasets(text: str, block: int) -> tuple[Dataset, Dataset, int]:
    """``(train, val, vocab_size)``: the text's characters as ids, cut into windows of
    ``block`` (the first 90% for training, the rest for validation); each row's ``labels`` are
    its ``input_ids`` (the model shifts them, as Hugging Face's causal LMs do)."""
    vocab = CharVocab(text)  # nanoGPT's: the sorted distinct characters
    tokens = vocab.encode(text).tolist()
    split = len(tokens) * 9 // 10

    def windows(lo: int, hi: int) -> Dataset:
        rows = [tokens[i:i + block] for i in range(lo, hi - block + 1, block)]
        return Dataset.from_dict({"input_ids": rows, "labels": rows}).with_format("torch")

    return windows(0, split), windows(split, len(tokens)), len(vocab)


def tiny_gpt2(vocab_size: int, block: int, layers: int = 4, width: int = 128,
              heads: int = 4) -> GPT2LMHeadModel:
    """A GPT-2 of ``layers`` blocks of ``width``, randomly initialised (the seed set before),
    without dropout (as exogym's char-GPT tasks: the same numbers in every engine)."""
    config = GPT2Config(vocab_size=vocab_size, n_positions=block, n_embd=width, n_layer=layers,
                        n_head=heads, bos_token_id=0, eos_token_id=0, use_cache=False,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        loss_type="ForCausalLM")
    return GPT2LMHeadModel(config)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--block", type=int, default=64, help="characters per window")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--H", type=int, default=50, help="DiLoCo's inner steps per outer step")
    p.add_argument("--allow-unsynced", action="store_true",
                   help="let a run shorter than --H go on (DiLoCo's model stays the initial one)")
    p.add_argument("--engine", default="auto", choices=("auto", "loop", "threads", "process"),
                   help="auto, loop, threads (the simulator) or process (one process per node)")
    p.add_argument("--network", default="home-100mbps")
    p.add_argument("--eval-samples", type=int, default=500)
    p.add_argument("--out", type=Path, default=None,
                   help="a new folder for the two runs (default: runs/huggingface-ENGINE-TIME)")
    p.add_argument("--data-dir", default=None, help="a folder holding tinyshakespeare/ "
                                                     "(default: download)")
    return p


def _checked(p: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """Everything that can be wrong with the command line, said before any training; the
    folder the runs go in (a new one per command by default, so commands follow each other)."""
    for name in ("steps", "nodes", "batch_size", "block", "layers", "width", "H",
                 "eval_samples"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps < args.H and not args.allow_unsynced:
        p.error(f"--steps {args.steps} is shorter than DiLoCo's --H {args.H}: its nodes would "
                f"never synchronise; give --H {args.steps} or less, more --steps, or "
                "--allow-unsynced")
    out = args.out
    if out is None:  # a new folder per command: the next free name of this second
        stem = Path("runs") / f"huggingface-{args.engine}-{time.strftime('%Y%m%d-%H%M%S')}"
        out = next(o for k in range(1, 1000)
                   if not (o := stem if k == 1 else Path(f"{stem}-{k}")).exists())
    for sid in STRATEGIES:
        try:
            check_out_dir(out / sid)
        except (OSError, ValueError) as e:
            p.error(str(e))
    return out


STRATEGIES = ("ddp", "diloco")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = _parser()
    args = p.parse_args(argv)
    out = _checked(p, args)
    text = read_text(args.data_dir, download=args.data_dir is None)
    train, val, vocab = char_datasets(text, args.block)
    results = {}
    for sid in STRATEGIES:
        hyper = {"H": args.H} if sid == "diloco" else {}
        torch.manual_seed(0)
        model = tiny_gpt2(vocab, args.block, args.layers, args.width)
        settings = {"max_steps": args.steps, "batch_size": args.batch_size, "seed": 0,
                    "network": args.network, "eval_interval": max(1, args.steps // 4),
                    "eval_samples": args.eval_samples, "out_dir": out / sid,
                    "progress": False, "allow_unsynced": args.allow_unsynced}
        if args.engine == "process":  # real processes, real collectives (gloo)
            result = fit_processes(model, train, val, strategy=make(sid, **hyper),
                                   num_nodes=args.nodes, **settings)
        else:
            result = Trainer(model, train, val).fit(strategy=make(sid, **hyper),
                                                    num_nodes=args.nodes, engine=args.engine,
                                                    **settings)
        results[sid] = result
        flops = (result.compute or {}).get("step", {}).get("flops", float("nan"))
        print(f"{sid:7s} eval loss {result.final['eval_loss']:.4f}  sent per node "
              f"{max(result.bytes_sent) / 1e6:,.2f} MB  {result.samples_per_s:,.0f} samples/s  "
              f"{flops / 1e9:.3f} GFLOP per step per node (counted)")
    print(f"written to {out}")
    return results


if __name__ == "__main__":
    main()
