"""EXO Gym's own example scripts run unchanged on exogym.

``tests/compat/exo_gym_examples/example/`` holds EXO Gym's ``example/mnist.py``,
``playground.py``, ``diloco_scaling.py``, ``nanogpt_train.py`` and the ``nanogpt`` package they
import, byte for byte as in its repository at commit 9fa323c (checked below by their git blob
ids). Each script runs in a subprocess, in a temporary folder, with only what a test machine needs
changed:

- budgets: the substitutions of :data:`EXAMPLES` (each must still match its file), or the
  script's own command-line arguments;
- data and services, by stand-ins on the script's ``PYTHONPATH``
  (``tests/compat/exo_gym_examples/stubs``): ``torchvision`` serves MNIST from
  ``$EXOGYM_DATA_DIR`` (at most ``EXOGYM_STUB_MNIST_LIMIT`` samples), ``datasets`` refuses
  downloads (the nanogpt scripts read Tiny Shakespeare from their cache,
  ``data/shakespeare_char/*.npy``, written first from ``$EXOGYM_DATA_DIR`` with EXO Gym's
  character vocabulary), ``wandb`` records each run and row to a file instead of W&B's servers.

EXO Gym's ``example/image_train.py`` is not run: it needs timm's ConvNeXt V2 and the ImageNet-100
download (Hugging Face), neither of which a stand-in could give without replacing what it tests.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from support.scripts import ROOT

HERE = ROOT / "tests" / "compat" / "exo_gym_examples"

# EXO Gym's files at commit 9fa323c: their git blob ids (`git ls-tree -r 9fa323c example/`)
BLOBS = {
    "example/mnist.py": "e340aa5fbfb8017938519f5de99ad82a6b01b4dd",
    "example/playground.py": "f77eae5c7562d104c29b3c09fe49d16cd5394b1e",
    "example/diloco_scaling.py": "57433832dae7bbe17a2280ad4faa7701bafd75fc",
    "example/nanogpt_train.py": "ec7beba25a9634fe25cc4ac846274b8cf9299204",
    "example/nanogpt/__init__.py": "d79e8b6903af840ee5038b98b427037fffd2b7b8",
    "example/nanogpt/build_dataset.py": "9ad3e57bfd478497008ae59af4ed3e17fe5ba190",
    "example/nanogpt/dataset.py": "73fefeb7cce01c1e284cf9f76773ff2d3fa625f6",
    "example/nanogpt/gpt_dataset.py": "d56fa4a88dc7aebce78c73af9610cd2256fffab3",
    "example/nanogpt/nanogpt.py": "569038008c1f4aa56a212e5a69b6d0942a2f9724",
}
# EXO Gym's character vocabulary (nanogpt/build_dataset.py, generate_char_vocab), then <EOS>
VOCAB = " !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz\n"
VOCAB_SIZE = len(VOCAB) + 1  # 66: the model's output classes


@dataclass(frozen=True)
class Example:
    """How a script runs here: text substitutions (budgets), arguments, the Tiny Shakespeare
    caches ``(block_size, start_pc, end_pc)`` it reads."""

    subs: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    caches: tuple[tuple[int, float, float], ...] = ()


EXAMPLES = {
    # three strategies, 4 nodes, 2 steps of 8 samples each; 64 MNIST samples per split
    "mnist.py": Example(subs={"max_steps=150": "max_steps=2", "batch_size=256": "batch_size=8",
                              "H=20": "H=2", "val_interval=10": "val_interval=2"}),
    # DiLoCo on a 4-layer GPT, 4 nodes: sequences of 32, 2 steps (H=2), 4 evaluation samples;
    # the evaluation split the last 0.01% of the text (the final evaluation takes all of it)
    "playground.py": Example(
        subs={"block_size=1024": "block_size=32", "start_pc=0.99": "start_pc=0.9999",
              "max_steps=5000": "max_steps=2", "H=200": "H=2", "batch_size=16": "batch_size=2",
              "minibatch_size=8": "minibatch_size=1", "val_size=256": "val_size=4"},
        caches=((32, 0.0, 0.99), (32, 0.9999, 1.0))),
    # its five runs (SimpleReduce on 1 node, DiLoCo on 1, 2, 4, 8), 2 steps each, 256 tokens a
    # step; W&B against the examples trained
    "diloco_scaling.py": Example(
        subs={"SEQ_LEN = 2**10": "SEQ_LEN = 2**5",
              "SHAKESPEARE_GLOBAL_BATCH_SIZE = 2**14": "SHAKESPEARE_GLOBAL_BATCH_SIZE = 2**8",
              "TOTAL_TOKENS = (2**15) * (2**13)": "TOTAL_TOKENS = (2**8) * 2",
              "H = 30": "H = 2", "start_pc=0.99": "start_pc=0.9999",
              "val_size=512": "val_size=8"},
        caches=((32, 0.0, 0.99), (32, 0.9999, 1.0))),
}
# nanogpt_train.py takes its budget as arguments
NANOGPT_ARGS = ("--dataset", "shakespeare", "--block_size", "32", "--num_nodes", "2",
                "--batch_size", "2", "--max_steps", "2", "--H", "2", "--warmup_steps", "1",
                "--val_size", "4", "--val_interval", "1", "--val_start_pc", "0.9999")


def _blob_id(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_the_examples_are_exo_gym_s_files() -> None:
    assert {p.relative_to(HERE).as_posix() for p in (HERE / "example").rglob("*.py")} == set(BLOBS)
    for name, blob in BLOBS.items():
        assert _blob_id(HERE / name) == blob, f"{name} differs from EXO Gym's at 9fa323c"
    assert repr(VOCAB)[1:-1] in (HERE / "example/nanogpt/build_dataset.py").read_text()
    for name, example in EXAMPLES.items():
        text = (HERE / "example" / name).read_text(encoding="utf-8")
        for old in example.subs:
            assert old in text, f"{name} no longer contains {old!r}: update EXAMPLES"


def _shakespeare_cache(data: Path, folder: Path, block_size: int, start_pc: float,
                       end_pc: float) -> None:
    """The file EXO Gym's ``build_dataset_small("shakespeare", block_size, start_pc, end_pc)``
    reads before it would download: that fraction of Tiny Shakespeare as EXO Gym's character
    ids (its records ended with <EOS>; this text is one record)."""
    text = (data / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    part = text[int(len(text) * start_pc):int(len(text) * end_pc)]
    ids = np.array([VOCAB.index(c) for c in part], dtype=np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / f"data_block{block_size}_{start_pc}_{end_pc}.npy", ids)


def _run(tmp_path: Path, script: str, example: Example,
         data: Path) -> subprocess.CompletedProcess[str]:
    """``python example/SCRIPT ARGS`` in ``tmp_path`` (EXO Gym's ``example/`` copied there, the
    script with ``example.subs``), with the stand-ins first on ``PYTHONPATH`` and the data
    folder ``data``."""
    shutil.copytree(HERE / "example", tmp_path / "example")
    path = tmp_path / "example" / script
    text = path.read_text(encoding="utf-8")
    for old, new in example.subs.items():
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    for block, start, end in example.caches:
        _shakespeare_cache(data, tmp_path / "data" / "shakespeare_char", block, start, end)
    env = {**os.environ, "PYTHONPATH": str(HERE / "stubs"), "MPLBACKEND": "Agg",
           "EXOGYM_DATA_DIR": str(data), "EXOGYM_STUB_MNIST_LIMIT": "64",
           "EXOGYM_STUB_WANDB_LOG": str(tmp_path / "wandb.jsonl")}
    done = subprocess.run([sys.executable, str(path), *example.args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "Traceback" not in done.stderr
    return done


def _wandb(tmp_path: Path) -> list[dict]:
    path = tmp_path / "wandb.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _warned(stderr: str) -> list[tuple[str, str]]:
    """``(class, argument)`` of each ExoGymWarning about an argument EXO Gym's class ignored."""
    return re.findall(r"ExoGymWarning: (\w+): (\w+)=.* is not an argument", stderr)


def test_mnist(tmp_path: Path, mnist_data: Path) -> None:
    done = _run(tmp_path, "mnist.py", EXAMPLES["mnist.py"], mnist_data)
    # each strategy's CSV logs, read back by the script's own plot function: evaluations before
    # step 1 and after step 2 (64 test images: losses near ln 10 = 2.30 after 2 steps); its
    # summary ranks the three
    for name in ("ddp", "diloco", "sparta"):
        (folder,) = (tmp_path / "logs").glob(f"mnist_{name}_*")
        with open(folder / "validation.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["step"]) for r in rows] == [0, 2]
        assert all(abs(float(r["global_loss"]) - 2.30) < 0.3 for r in rows)
        assert f"Loaded 2 validation points for {name.upper()}" in done.stdout
    ranked = re.findall(r"#\d+ +(\w+): ([\d.]+)\n", done.stdout.split("LOSS SUMMARY")[1])
    assert sorted(name for name, _ in ranked) == ["DDP", "DILOCO", "SPARTA"]
    assert [float(loss) for _, loss in ranked] == sorted(float(loss) for _, loss in ranked)
    # the example gives H and p to all three classes: each that did not declare one says so
    assert _warned(done.stderr) == [("SimpleReduceStrategy", "H"), ("SimpleReduceStrategy", "p"),
                                    ("DiLoCoStrategy", "p"), ("SPARTAStrategy", "H"),
                                    ("SPARTAStrategy", "p")]


def _trained_gpt(stderr: str) -> None:
    """The run's progress (whole lines: stderr is no terminal here) ends after 2 steps with an
    evaluation, both losses at most about ln(66) (a uniform guess over EXO Gym's 65 characters
    and <EOS>), where a character GPT starts, and not far below it after 2 steps."""
    ends = re.findall(r"step 2/2 \(100%\), .*train_loss ([\d.]+), eval_loss ([\d.]+)", stderr)
    assert ends, stderr[-2000:]
    uniform = math.log(VOCAB_SIZE)
    assert all(uniform - 1.0 < float(x) < uniform + 0.2 for x in ends[-1])


def test_playground(tmp_path: Path, shakespeare_data: Path) -> None:
    done = _run(tmp_path, "playground.py", EXAMPLES["playground.py"], shakespeare_data)
    for _, start, end in EXAMPLES["playground.py"].caches:  # read from the cache written here
        assert f"Loading cached dataset from data/shakespeare_char/data_block32_{start}_{end}.npy" \
            in done.stdout
    _trained_gpt(done.stderr)
    assert not (tmp_path / "logs").exists()  # no run_name: no CSV logs (EXO Gym's crashed)


def test_diloco_scaling(tmp_path: Path, shakespeare_data: Path) -> None:
    _run(tmp_path, "diloco_scaling.py", EXAMPLES["diloco_scaling.py"], shakespeare_data)
    records = _wandb(tmp_path)
    runs = [r for r in records if "init" in r]
    # K = 0: SimpleReduceStrategy (exogym's ddp) on 1 node; K = 1, 2, 4, 8: DiLoCo on K nodes,
    # 256 // 32 // K sequences each; the script's kwargs={'dataset_name': ...} in the config
    assert [(r["init"], r["config"]["strategy"], r["config"]["num_nodes"],
             r["config"]["batch_size_per_node"]) for r in runs] == [
        ("ddp-batchsize256", "ddp", 1, 8), ("diloco-K1-batchsize256", "diloco", 1, 8),
        ("diloco-K2-batchsize128", "diloco", 2, 4), ("diloco-K4-batchsize64", "diloco", 4, 2),
        ("diloco-K8-batchsize32", "diloco", 8, 1)]
    assert all(r["project"] == "DiLoCo-Scaling" and r["config"]["dataset_name"] == "shakespeare"
               for r in runs)
    # log_x_axis="examples": each row at W&B step = the sequences trained (8 a step)
    for r in runs:
        steps = [x["step"] for x in records if x.get("log") == r["init"]]
        assert steps == [0, 8, 16]
    assert [x["exit_code"] for x in records if "finish" in x] == [0] * 5


@pytest.mark.parametrize("strategy", ["base", "fedavg", "sparta", "diloco", "demo",
                                      "diloco_sparta"])
def test_nanogpt_train(strategy: str, tmp_path: Path, shakespeare_data: Path) -> None:
    example = Example(args=(*NANOGPT_ARGS, "--strategy", strategy),
                      caches=((32, 0.0, 0.9), (32, 0.9999, 1.0)))
    done = _run(tmp_path, "nanogpt_train.py", example, shakespeare_data)
    _trained_gpt(done.stderr)
    # its CSV logs (run_name from its arguments) and the model it saves from fit's return value
    (folder,) = (tmp_path / "logs").iterdir()
    with open(folder / "train.csv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [0, 1]
    state = torch.load(tmp_path / "checkpoints" / f"{folder.name}_model.pt")
    assert state["transformer.wte.weight"].shape[0] == VOCAB_SIZE
    # the arguments EXO Gym's classes ignored, said (FedAvgStrategy(island_size=num_nodes):
    # all the nodes, exogym's FedAvg, no warning)
    assert _warned(done.stderr) == {
        "fedavg": [("FedAvgStrategy", "inner_optim_spec")],
        "sparta": [("SPARTAStrategy", "async_sparta_delay")],
        "demo": [("DeMoStrategy", "max_norm")]}.get(strategy, [])
