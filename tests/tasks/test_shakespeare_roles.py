"""Tiny Shakespeare by speaking role (exogym.tasks.data.shakespeare_roles) and the ``natural``
partition that gives node ``i`` the dataset's client ``i`` (exogym.sim.partition, .sharding).

The hand-written play below is parsed, split and windowed by hand in the comments; the real file
is read from the tests' data folder (the ``shakespeare_data`` fixture of ``conftest.py``), and its
numbers were checked by a second parser written apart from the module.
"""

from __future__ import annotations

import json
import math
import statistics
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset, TensorDataset

from exogym.cli import main
from exogym.run.nodes.population import client_records
from exogym.run.trainer import Trainer
from exogym.sim.partition import Partition, natural_shards, parse_partition
from exogym.sim.sharding import NodeBatches
from exogym.strategy import make
from exogym.tasks.data.shakespeare import split_text
from exogym.tasks.data.shakespeare_roles import (
    ShakespeareRoles,
    Speech,
    load_shakespeare_roles,
    parse_speeches,
    role_texts,
    split_roles,
)
from exogym.tasks.gpt import GPT, GPTConfig
from exogym.tasks.registry import ROLES_CLIENTS, TASKS, get_task

PLAY = (
    "First Citizen:\n"        # 1
    "Speak.\n"                # 2
    "Come:\n"                 # 3  a name-like line inside a speech: text
    "\n"                      # 4
    "ALL:\n"                  # 5
    "No.\n"                   # 6
    "\n"                      # 7  two blank lines: one separator
    "\n"                      # 8
    "Page:\n"                 # 9  a role too short
    "Hi\n"                    # 10
    "\n"                      # 11
    "TITUS:\n"                # 12 a speaker line alone: an empty speech
    "\n"                      # 13
    "First  citizen:\n"       # 14 FIRST CITIZEN again, spaced and cased otherwise
    "We are resolved; resolved\n"  # 15
    "\n"                      # 16
    "All:\n"                  # 17
    "Yes, yes, yes.\n"        # 18
)
# FIRST CITIZEN: "Speak.\n" (7) + "Come:\n" (6) + "\n" + "We are resolved; resolved\n" (26) = 40
# characters: train = the first floor(9 * 40 / 10) = 36, val = the last 4.
# ALL: "No.\n" (4) + "\n" + "Yes, yes, yes.\n" (15) = 20: train 18, val 2.
# PAGE: "Hi\n" = 3: train 2. TITUS: "" = 0.
FIRST = "Speak.\nCome:\n\nWe are resolved; resolved\n"
ALL = "No.\n\nYes, yes, yes.\n"
T = 3  # block size: a role's split of L tokens has L - 3 training windows (stride 1)


@pytest.fixture(scope="module")
def play() -> tuple[ShakespeareRoles, ShakespeareRoles]:
    # min_windows 15: FIRST CITIZEN (36 - 3 = 33 windows) and ALL (18 - 3 = 15) are clients,
    # PAGE (2 characters: none) and TITUS (none) are dropped
    return split_roles(PLAY, T, min_windows=15)


# --------------------------------------------------------------------------- parsing


def test_speeches_of_a_hand_written_play() -> None:
    assert parse_speeches(PLAY) == [
        Speech(role="FIRST CITIZEN", speaker="First Citizen", lines=("Speak.", "Come:"), line=1),
        Speech(role="ALL", speaker="ALL", lines=("No.",), line=5),
        Speech(role="PAGE", speaker="Page", lines=("Hi",), line=9),
        Speech(role="TITUS", speaker="TITUS", lines=(), line=12),
        Speech(role="FIRST CITIZEN", speaker="First  citizen",
               lines=("We are resolved; resolved",), line=14),
        Speech(role="ALL", speaker="All", lines=("Yes, yes, yes.",), line=17),
    ]
    assert role_texts(parse_speeches(PLAY)) == {
        "FIRST CITIZEN": FIRST, "ALL": ALL, "PAGE": "Hi\n", "TITUS": ""}
    assert (len(FIRST), len(ALL)) == (40, 20)
    # no final newline, blank lines of spaces and a blank start change nothing
    assert parse_speeches("\n \nBoy:\nYes\n  \nGirl:\nNo") == [
        Speech(role="BOY", speaker="Boy", lines=("Yes",), line=3),
        Speech(role="GIRL", speaker="Girl", lines=("No",), line=6),
    ]


@pytest.mark.parametrize(("text", "match"), [
    ("Boy:\nYes\n\nthen he left\n", r"line 4: 'then he left' starts a speech \(it opens the text "
                                    r"or follows a blank line\) but is not a speaker line"),
    ("Hello there\nBoy:\n", r"line 1: 'Hello there' starts a speech"),
    ("Boy:\nYes\n\nGirl: No\n", r"line 4: 'Girl: No' starts a speech"),  # text on the name line
    ("Boy:\nYes\n\nGirl :\n", r"line 4: 'Girl :'"),  # a space before the colon
    ("Boy:\nYes\n\ngirl:\n", r"line 4: 'girl:'"),  # a name starts upper-case
])
def test_a_speech_that_does_not_start_with_a_speaker_line_is_an_error(
        text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_speeches(text)


# --------------------------------------------------------------------------- windows


def test_windows_clients_and_dropped_roles_by_hand(
        play: tuple[ShakespeareRoles, ShakespeareRoles]) -> None:
    train, val = play
    assert train.client_names == val.client_names == ["FIRST CITIZEN", "ALL"]
    assert train.dropped_roles == val.dropped_roles == ("PAGE", "TITUS")
    # train: 36 + 18 tokens; 33 + 15 windows; window k of a role starts at its offset + k
    assert train.tokens.numel() == 54 and len(train) == 48
    assert train.starts.tolist() == [*range(33), *range(36, 51)]
    assert train.clients.tolist() == [0] * 33 + [1] * 15
    # val (stride T = 3): FIRST CITIZEN's 4 characters hold one window, ALL's 2 none
    assert val.tokens.numel() == 6 and len(val) == 1 and val.clients.tolist() == [0]
    x, y = val[0]
    assert (val.vocab.decode(x), val.vocab.decode(y)) == ("ved", "ed\n")  # FIRST[36:40]
    # the vocabulary is the whole text's, speaker names included
    assert train.vocab.chars == split_text(PLAY, T)[0].vocab.chars and ":" in train.vocab.stoi
    # min_windows 16 drops ALL (15 windows) too
    assert split_roles(PLAY, T, min_windows=16)[0].dropped_roles == ("ALL", "PAGE", "TITUS")


def test_every_window_lies_inside_one_role(
        play: tuple[ShakespeareRoles, ShakespeareRoles]) -> None:
    train, _ = play
    x, y = train.get_batch(torch.arange(len(train)))
    assert torch.equal(x[:, 1:], y[:, :-1])
    texts = [FIRST[:36], ALL[:18]]
    firsts = [0, 33]
    for i in range(len(train)):
        role = int(train.clients[i])
        k = i - firsts[role]
        assert train.vocab.decode(torch.cat([x[i], y[i, -1:]])) == texts[role][k: k + T + 1]
    # the border: FIRST CITIZEN's last window ends its training text, ALL's first starts its own
    assert train.vocab.decode(y[32]) == "sol" and train.vocab.decode(x[33]) == "No."
    assert train.get_batch([-1])[1].tolist() == y[47:48].tolist()
    with pytest.raises(IndexError, match="out of range for 48 windows"):
        train.get_batch([48])


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"min_windows=0 is invalid; expected an int >= 1"):
        split_roles(PLAY, T, min_windows=0)
    with pytest.raises(ValueError, match=r"no role has 34 training windows of block_size 3 \(all "
                                         r"4 dropped\)"):
        split_roles(PLAY, T, min_windows=34)
    with pytest.raises(ValueError, match=r"block_size=0 is invalid"):
        split_roles(PLAY, 0, min_windows=1)


# --------------------------------------------------------------------------- natural partition


def test_parse_natural() -> None:
    assert parse_partition(" Natural ") == Partition(kind="natural")
    assert parse_partition("natural").spec == "natural"
    with pytest.raises(ValueError, match=r"partition 'natural:2' is not valid; allowed: .*"
                                         r"'natural' \(the dataset's own clients"):
        parse_partition("natural:2")
    with pytest.raises(ValueError, match="alpha applies only to kind='dirichlet'"):
        Partition(kind="natural", alpha=0.5)


def test_natural_shards_are_the_clients(
        play: tuple[ShakespeareRoles, ShakespeareRoles]) -> None:
    train, _ = play
    batches = NodeBatches(train, 2, 4, seed=0, partition="natural")
    assert batches.shards is not None
    assert [s.tolist() for s in batches.shards] == [list(range(33)), list(range(33, 48))]
    assert batches.per_node == 15 and batches.steps_per_epoch == 48 // (2 * 4)
    for _ in range(10):  # node i only ever reads client i's windows
        ids = batches.next_indices()
        assert train.clients[ids].tolist() == [[0] * 4, [1] * 4]
    assert batches.partition_stats() == {"partition": "natural", "sizes": [33, 15]}


def test_natural_partition_errors_name_the_numbers(
        play: tuple[ShakespeareRoles, ShakespeareRoles]) -> None:
    train, _ = play
    with pytest.raises(ValueError, match=r"partition 'natural' gives each of the 2 clients of "
                                         r"ShakespeareRoles its own node, but the run has 3 nodes: "
                                         r"run with 2 nodes \(--nodes 2;"):
        NodeBatches(train, 3, 4, seed=0, partition="natural")
    with pytest.raises(ValueError, match=r"client 1 \('ALL'\) of ShakespeareRoles has 15 "
                                         r"samples, fewer than batch_size 16; use a batch_size "
                                         r"<= 15"):
        NodeBatches(train, 2, 16, seed=0, partition="natural")
    text, _ = split_text(PLAY, T)
    with pytest.raises(ValueError, match=r"ShakespeareChar has no 'clients' attribute .*; for "
                                         r"ShakespeareChar use 'iid' or 'contiguous'$"):
        NodeBatches(text, 2, 4, seed=0, partition="natural")
    labelled = TensorDataset(torch.zeros(6))
    labelled.targets = torch.arange(6) % 2  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"for TensorDataset use 'iid', 'dirichlet:ALPHA' or "
                                         r"'contiguous'$"):
        NodeBatches(labelled, 2, 1, seed=0, partition="natural")
    with pytest.raises(ValueError, match=r"partition 'natural' needs one shared Dataset"):
        NodeBatches(lambda rank, n, train: labelled, 2, 1, seed=0, partition="natural")


def test_natural_shards_check_the_client_ids() -> None:
    data = TensorDataset(torch.zeros(5))
    data.clients = [1, 0, 1, 2, 0]  # type: ignore[attr-defined]
    assert [s.tolist() for s in natural_shards(data, 3)] == [[1, 4], [0, 2], [3]]
    data.clients = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"TensorDataset.clients must be one integer client id "
                                         r"per sample \(5\), got torch.float32 \(5,\)"):
        natural_shards(data, 2)
    data.clients = [0, 1, 2]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"one integer client id per sample \(5\), got "
                                         r"torch.int64 \(3,\)"):
        natural_shards(data, 3)
    data.clients, data.client_names = [0, 1, 2, 0, 1], ["a", "b"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"must lie in 0..1 \(2 clients\), got ids 0..2"):
        natural_shards(data, 2)
    data.clients = [0, 0, 0, 0, 0]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"client 1 \('b'\) of TensorDataset has 0 samples"):
        natural_shards(data, 2)


# --------------------------------------------------------------------------- the real file


def test_real_file_roles(shakespeare_data: Path) -> None:
    # block 64, min_windows 32
    train, val = load_shakespeare_roles(shakespeare_data, download=False)
    assert len(train.client_names) == ROLES_CLIENTS == 243 and len(train.dropped_roles) == 59
    assert train.client_names[:5] == ["FIRST CITIZEN", "ALL", "SECOND CITIZEN", "MENENIUS",
                                      "MARCIUS"]
    assert train.dropped_roles[:3] == ("TITUS", "GENTLEWOMAN", "SECOND SOLDIER")
    assert (len(train), len(val), len(train.vocab)) == (913_208, 1_488, 65)
    sizes = torch.bincount(train.clients).tolist()
    assert (min(sizes), statistics.median(sizes), max(sizes)) == (35, 1094, 33_979)
    assert train.client_names[sizes.index(33_979)] == "GLOUCESTER"
    assert torch.all(train.clients[1:] >= train.clients[:-1])  # ids in sample order
    x, _ = train[0]
    assert train.vocab.decode(x) == ("Before we proceed any further, hear me speak.\n\nYou are "
                                     "all resol")  # FIRST CITIZEN's text, no speaker line
    batches = NodeBatches(train, ROLES_CLIENTS, 32, seed=0, partition="natural")
    assert batches.shards is not None
    assert torch.equal(torch.sort(torch.cat(batches.shards)).values, torch.arange(len(train)))
    assert all(bool((train.clients[s] == i).all()) for i, s in enumerate(batches.shards))


def test_the_task(shakespeare_data: Path, tmp_path: Path,
                  capsys: pytest.CaptureFixture[str]) -> None:
    task = get_task("shakespeare-roles-gpt-v0")
    base = TASKS["shakespeare-char-gpt-v0"]
    assert f"{ROLES_CLIENTS} clients" in task.description
    assert f"--partition natural --nodes {ROLES_CLIENTS}" in task.description
    assert (task.batch_size, task.lr, task.eval_interval) == (base.batch_size, base.lr,
                                                              base.eval_interval)
    torch.manual_seed(0)
    model = task.build_model()
    assert isinstance(model, GPT) and model.config == base.build_model().config  # type: ignore
    # a wrong --nodes says how many
    rc = main(["run", "--task", task.id, "--data-dir", str(shakespeare_data), "--no-download",
               "--strategy", "fedavg", "--set", "H=1", "--nodes", "4", "--partition", "natural",
               "--steps", "1", "--no-progress",
               "--out", str(tmp_path / "run")])
    assert rc == 2
    assert "run with 243 nodes (--nodes 243;" in capsys.readouterr().err


@pytest.mark.usefixtures("single_thread")
def test_fedavg_with_participation_over_real_roles(shakespeare_data: Path,
                                                   tmp_path: Path) -> None:
    # block 16, roles with >= 20,000 training windows: 9 clients, 4 of them per round
    train, val = load_shakespeare_roles(shakespeare_data, block_size=16, min_windows=20_000,
                                        download=False)
    assert train.client_names == ["MENENIUS", "CORIOLANUS", "GLOUCESTER", "KING RICHARD II",
                                  "ROMEO", "JULIET", "LEONTES", "DUKE VINCENTIO", "PETRUCHIO"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=1, n_embd=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = Trainer(model, train, Subset(val, range(64))).fit(
            strategy=make("fedavg", H=2), num_nodes=9, max_steps=4, batch_size=4,
            partition="natural", participation=4, eval_interval=4, seed=0, progress=False,
            network="home-100mbps", step_time=0.1, out_dir=tmp_path / "run")
    assert math.isfinite(result.final["eval_loss"])
    assert result.final["eval_loss"] < math.log(65) + 0.2  # about an untrained model's
    assert result.samples == 4 * 4 * 4  # 4 participants x 4 steps x batch 4
    # the round's 4 clients in seats (exogym.run.nodes.population), its log in client ids
    reduces = [rec for rec in client_records(result.comm_log, result.rounds, 2)
               if rec.op == "all_reduce"]
    assert [rec.step for rec in reduces] == [1, 3]  # a round every H = 2 steps
    assert [bin(rec.members).count("1") for rec in reduces] == [4, 4]
    stats = json.loads((tmp_path / "run" / "config.json").read_text())["partition_stats"]
    sizes = torch.bincount(train.clients)
    assert stats == {"partition": "natural", "mode": "disjoint", "clients": 9,
                     "sizes": {"min": int(sizes.min()), "median": float(sizes.median()),
                               "max": int(sizes.max())}}
