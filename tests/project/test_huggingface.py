"""A Hugging Face model and dataset as they are (examples/huggingface.py): a ``transformers``
GPT-2 from a config on a ``datasets.Dataset`` of dict rows trains under DDP and DiLoCo, its dict
batches passed as keyword arguments, its loss read from the output object, its FLOPs counted;
the simulator and one process per node give the same numbers. Skipped without the ``hf`` extra
(``pip install -e ".[hf]"``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.scripts import load_script

pytest.importorskip("transformers", reason="the hf extra: pip install -e '.[hf]'")
pytest.importorskip("datasets", reason="the hf extra: pip install -e '.[hf]'")

from exogym.sim.engine import call_model, run_model

hf = load_script("examples/huggingface.py", "huggingface_example")
TINY = ["--steps", "8", "--H", "4", "--nodes", "2", "--layers", "1", "--width", "32",
        "--batch-size", "4", "--eval-samples", "32"]


def test_a_dict_batch_goes_to_forward_as_keywords() -> None:
    torch.manual_seed(0)
    model = hf.tiny_gpt2(vocab_size=11, block=8, layers=1, width=16, heads=2)
    ids = torch.randint(0, 11, (3, 8))
    batch = {"input_ids": ids, "labels": ids}
    want = model(input_ids=ids, labels=ids).loss
    assert torch.equal(run_model(model, batch).loss, want)
    state = dict(model.named_parameters())
    assert torch.allclose(call_model(model, state, batch).loss, want)

    class TakesADict(torch.nn.Module):  # a forward whose parameter is the batch: positional
        def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return batch["x"].sum()

    assert run_model(TakesADict(), {"x": torch.ones(2)}).item() == 2.0


def test_the_example_trains_ddp_and_diloco_with_counted_flops(
        tmp_path: Path, shakespeare_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = hf.main([*TINY, "--data-dir", str(shakespeare_data), "--out", str(tmp_path)])
    assert sorted(results) == ["ddp", "diloco"]
    for sid, result in results.items():
        assert math.isfinite(result.final["eval_loss"]), sid
        assert result.compute["step"]["flops"] > 0 and result.compute["step"]["parameters"] > 0
    # DiLoCo at H = 4 sends a quarter of DDP's bytes (one all-reduce of the parameters every 4
    # steps against one of the gradients every step)
    ratio = max(results["diloco"].bytes_sent) / max(results["ddp"].bytes_sent)
    assert ratio == pytest.approx(0.25)
    out = capsys.readouterr().out
    assert "GFLOP per step per node (counted)" in out


@pytest.mark.slow
def test_one_process_per_node_gives_the_simulators_numbers(
        tmp_path: Path, shakespeare_data: Path) -> None:
    sim = hf.main([*TINY, "--data-dir", str(shakespeare_data), "--out", str(tmp_path / "s"),
                   "--engine", "loop"])
    real = hf.main([*TINY, "--data-dir", str(shakespeare_data), "--out", str(tmp_path / "p"),
                    "--engine", "process"])
    for sid in ("ddp", "diloco"):  # gloo's all-reduce sums in another order: round-off only
        assert real[sid].final["eval_loss"] == pytest.approx(sim[sid].final["eval_loss"],
                                                             rel=1e-4), sid
        assert real[sid].bytes_sent == sim[sid].bytes_sent


def test_the_page_s_commands_follow_each_other_and_bad_input_is_refused_first(
        tmp_path: Path, shakespeare_data: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = ["--data-dir", str(shakespeare_data)]
    hf.main([*TINY, *data])
    first = capsys.readouterr().out.splitlines()[-1]
    assert first.startswith("written to runs/huggingface-auto-")
    hf.main([*TINY, *data, "--engine", "loop"])  # a second command: its own folder
    assert capsys.readouterr().out.splitlines()[-1].startswith("written to runs/huggingface-loop-")
    # an existing folder, a run shorter than H: refused by name before any training
    taken = first.removeprefix("written to ")
    for bad, says in ((["--out", taken], "already exists and is not empty"),
                      (["--steps", "3", "--H", "4"], "--steps 3 is shorter than DiLoCo's --H 4"),
                      (["--nodes", "0"], "--nodes must be >= 1, got 0")):
        with pytest.raises(SystemExit) as e:
            hf.main([*TINY, *data, *bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
    with pytest.warns(UserWarning, match="3 steps is not a multiple of H=4"):
        results = hf.main([*TINY, *data, "--steps", "3", "--H", "4", "--allow-unsynced"])
    assert results["diloco"].steps == 3


def test_a_dataset_without_labels_is_an_error_that_says_labels() -> None:
    """GPT-2 on rows of input_ids only (no labels): transformers returns no loss, and the error
    says so and that the dataset needs a 'labels' column."""
    from datasets import Dataset

    from exogym import Trainer

    torch.manual_seed(0)
    model = hf.tiny_gpt2(vocab_size=11, block=8, layers=1, width=16, heads=2)
    rows = Dataset.from_dict({"input_ids": torch.randint(0, 11, (16, 8)).tolist()})
    rows = rows.with_format("torch")
    with pytest.raises(TypeError) as err:
        Trainer(model, rows, rows).fit(strategy="ddp", num_nodes=2, max_steps=2, batch_size=4,
                                       device="cpu", progress=False, network=None)
    message = str(err.value)
    assert message.startswith("the model returned no loss: a mapping without 'loss' (keys "
                              "['logits']). A Hugging Face causal LM")
    assert "the dataset needs a 'labels' column (or the batch a 'labels' key" in message
