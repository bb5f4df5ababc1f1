"""``exogym sample``: text from a trained Shakespeare GPT run folder (model.pt + config.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from exogym.cli import main
from exogym.lab.sample import load_run_model, sample
from exogym.utils.config import ConfigError

TASK = "shakespeare-char-gpt-v0"


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory: pytest.TempPathFactory, shakespeare_data: Path) -> Path:
    out = tmp_path_factory.mktemp("gpt") / "run"
    rc = main(["run", "--task", TASK, "--strategy", "diloco", "--set", "H=2", "--nodes", "2",
               "--steps", "4", "--batch-size", "4", "--eval-interval", "2", "--network",
               "datacenter", "--step-time", "10ms", "--out", str(out), "--data-dir",
               str(shakespeare_data), "--no-download", "--no-progress"])
    assert rc == 0
    return out


def test_the_run_folder_holds_the_final_global_model(gpt_run: Path,
                                                     shakespeare_data: Path) -> None:
    assert json.loads((gpt_run / "config.json").read_text())["task"] == TASK
    task_id, model = load_run_model(gpt_run)
    assert task_id == TASK
    # model.pt is the run's final global model: evaluating it gives the logged final loss.
    from exogym.tasks.registry import get_task

    _, val = get_task(TASK).load_data(shakespeare_data, False)
    x, y = val.get_batch(torch.arange(64))
    with torch.no_grad():
        loss = float(model((x, y))["loss"])
    summary = json.loads((gpt_run / "summary.json").read_text())
    assert 2.5 < loss < 4.5  # near log(65) = 4.17 after 4 steps
    assert summary["final"]["eval_loss"] == pytest.approx(loss, rel=0.05)


def test_sample_continues_the_prompt_deterministically(
    gpt_run: Path, capsys: pytest.CaptureFixture[str], shakespeare_data: Path
) -> None:
    text = sample(gpt_run, prompt="ROMEO:", max_new_tokens=40, seed=1, data_dir=shakespeare_data,
                  download=False)
    assert text.startswith("ROMEO:") and len(text) == 6 + 40
    assert text == sample(gpt_run, prompt="ROMEO:", max_new_tokens=40, seed=1,
                          data_dir=shakespeare_data, download=False)
    assert text != sample(gpt_run, prompt="ROMEO:", max_new_tokens=40, seed=2,
                          data_dir=shakespeare_data, download=False)
    rc = main(["sample", str(gpt_run), "--prompt", "ROMEO:", "--tokens", "40", "--seed", "1",
               "--data-dir", str(shakespeare_data), "--no-download"])
    assert rc == 0
    assert capsys.readouterr().out == text + "\n"


def test_sample_errors_name_the_problem(
    gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], shakespeare_data: Path
) -> None:
    with pytest.raises(ValueError, match=r"outside the corpus vocabulary: \['€'\]"):
        sample(gpt_run, prompt="€", data_dir=shakespeare_data, download=False)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 0"):
        sample(gpt_run, max_new_tokens=0, data_dir=shakespeare_data, download=False)
    assert main(["sample", str(tmp_path)]) == 2
    assert "config.json does not exist" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"strategy": "ddp"}))
    torch.save({}, tmp_path / "model.pt")
    with pytest.raises(ConfigError, match="records no task"):
        load_run_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"task": "mnist-cnn-v0"}))
    torch.save(load_run_model_state("mnist-cnn-v0"), tmp_path / "model.pt")
    with pytest.raises(ConfigError, match="'mnist-cnn-v0' is not a language model"):
        sample(tmp_path, data_dir=shakespeare_data, download=False)


def load_run_model_state(task_id: str) -> dict[str, torch.Tensor]:
    from exogym.tasks.registry import get_task

    return get_task(task_id).build_model().state_dict()


def test_the_run_records_its_vocabulary_so_sampling_needs_no_corpus(
        gpt_run: Path, tmp_path: Path, shakespeare_data: Path) -> None:
    config = json.loads((gpt_run / "config.json").read_text())
    assert len(config["vocab"]) == 65 and config["vocab"][:3] == "\n !"
    nothing = tmp_path / "no-data"  # no corpus here, and no download allowed
    text = sample(gpt_run, prompt="ROMEO:", max_new_tokens=40, seed=1, data_dir=nothing,
                  download=False)
    assert text == sample(gpt_run, prompt="ROMEO:", max_new_tokens=40, seed=1,
                          data_dir=shakespeare_data, download=False)


def test_a_corrupt_model_or_config_is_one_line_naming_the_file(
        gpt_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((gpt_run / "config.json").read_text())
    (broken / "model.pt").write_bytes((gpt_run / "model.pt").read_bytes()[:1000])
    assert main(["sample", str(broken)]) == 2
    err = capsys.readouterr().err
    assert f"{broken / 'model.pt'} cannot be loaded as the {TASK} model's weights" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    (broken / "config.json").write_text('{"task": "shakesp')
    assert main(["sample", str(broken)]) == 2
    assert "config.json is not valid JSON (truncated or corrupted?)" in capsys.readouterr().err
