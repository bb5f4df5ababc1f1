"""Tests for the benchmark tasks: registry, CIFAR-10 reader, Shakespeare windows, the GPT.

The real data is read from the tests' data folder (the ``*_data`` fixtures of ``conftest.py``);
these tests download nothing (the download test serves a hand-made archive by file://).
"""

from __future__ import annotations

import hashlib
import io
import math
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset

from exogym.run.trainer import Trainer
from exogym.strategy.diloco import DiLoCo
from exogym.tasks.data import cifar10
from exogym.tasks.data.cifar10 import CIFAR10, MEAN, STD, load_cifar10, read_cifar_batch
from exogym.tasks.data.download import ChecksumError, DatasetNotFoundError, RemoteFile
from exogym.tasks.data.shakespeare import CharVocab, ShakespeareChar, load_shakespeare, split_text
from exogym.tasks.gpt import GPT, GPTConfig
from exogym.tasks.registry import ALIASES, TASKS, CifarCNN, get_task
from exogym.utils.config import ConfigError

# --------------------------------------------------------------------------- registry


def test_registry_has_versioned_ids_and_the_mnist_alias() -> None:
    assert list(TASKS) == [
        "mnist-cnn-v0", "mnist-cnn-mcmahan-v0", "cifar10-cnn-v0", "shakespeare-char-gpt-v0",
        "shakespeare-char-gpt-small-v0", "shakespeare-roles-gpt-v0",
    ]
    # McMahan et al.'s CNN has the paper's 1,663,370 parameters (its Section 3)
    model = TASKS["mnist-cnn-mcmahan-v0"].build_model()
    assert sum(p.numel() for p in model.parameters()) == 1_663_370
    assert all(t.id == key for key, t in TASKS.items())
    assert ALIASES == {"mnist": "mnist-cnn-v0"}
    assert get_task("mnist") is TASKS["mnist-cnn-v0"]
    with pytest.raises(ConfigError, match=r"unknown task 'mnsit' \(did you mean 'mnist'\?\)"):
        get_task("mnsit")
    with pytest.raises(ConfigError,
                       match="available: mnist-cnn-v0, mnist-cnn-mcmahan-v0, cifar10-cnn-v0"):
        get_task("imagenet")


# --------------------------------------------------------------------------- CIFAR-10


def _record(label: int, r: bytes, g: bytes, b: bytes) -> bytes:
    assert len(r) == len(g) == len(b) == 1024
    return bytes([label]) + r + g + b


# record 0: label 3; red plane = 0, 1, ..., 255, 0, 1, ... (pixel k of the row-major 32x32 plane
# holds k % 256), green all 255, blue all 0. record 1: label 9, every byte 7.
RED = bytes(k % 256 for k in range(1024))
TWO_RECORDS = _record(3, RED, b"\xff" * 1024, b"\x00" * 1024) + _record(9, *(b"\x07" * 1024,) * 3)


def _cifar_folder(root: Path, test_name: str) -> Path:
    folder = root / "cifar10" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    for name in [*cifar10.TRAIN_FILES, test_name]:
        (folder / name).write_bytes(TWO_RECORDS)
    return folder


@pytest.fixture
def fake_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch file is expected to be TWO_RECORDS (size and sha256), as the hand-made
    folders hold: the checks themselves run unchanged."""
    digest = hashlib.sha256(TWO_RECORDS).hexdigest()
    monkeypatch.setattr(cifar10, "BATCH_FILES", {
        name: (2, RemoteFile(name, sha256=digest)) for name in cifar10.BATCH_FILES})


def test_cifar_files_are_checked_against_their_official_size_and_checksum(
        tmp_path: Path, cifar10_data: Path) -> None:
    real = cifar10_data / "cifar10" / "cifar-10-batches-bin"
    folder = tmp_path / "cifar10" / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    # the first 1,000 test records where the data folder has them, else the official test batch
    test_name = next(n for n in (cifar10.PARTIAL_TEST_FILE, cifar10.TEST_FILE)
                     if (real / n).is_file())
    for name in (*cifar10.TRAIN_FILES, test_name):
        (folder / name).symlink_to(real / name)
    assert len(load_cifar10(tmp_path, download=False)[0]) == 50_000  # the official files pass
    # data_batch_1.bin cut to 100 records: an error naming it, not 40,100 training images
    (folder / "data_batch_1.bin").unlink()
    (folder / "data_batch_1.bin").write_bytes((real / "data_batch_1.bin").read_bytes()[:307_300])
    with pytest.raises(ValueError, match=r"data_batch_1.bin' has 307,300 bytes \(100.0 records"
                                         r"\), expected 30,730,000 \(10,000 records\)"):
        load_cifar10(tmp_path, download=False)
    # the right size but one byte changed: the checksum says so
    data = bytearray((real / "data_batch_1.bin").read_bytes())
    data[5] ^= 1
    (folder / "data_batch_1.bin").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"data_batch_1.bin' has the wrong checksum: sha256"):
        load_cifar10(tmp_path, download=False)


def test_a_missing_test_batch_is_named(tmp_path: Path, fake_checksums: None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _cifar_folder(tmp_path, "test_batch.bin")
    (folder / "test_batch.bin").unlink()
    with pytest.raises(DatasetNotFoundError,
                       match=r"missing files:   test_batch.bin \(or test_batch_first1000.bin\)"):
        load_cifar10(tmp_path, download=False)
    monkeypatch.setattr(cifar10, "MIRRORS", ((tmp_path / "no-mirror").as_uri() + "/",))
    with pytest.raises(DatasetNotFoundError,  # no mirror answers, downloading allowed: named
                       match=r"missing in .*: test_batch.bin \(or test_batch_first1000.bin\); "
                             "fetching the archive that holds them failed"):
        load_cifar10(tmp_path, download=True)


def test_cifar_reader_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "b.bin"
    path.write_bytes(TWO_RECORDS)
    images, labels = read_cifar_batch(path)
    assert images.dtype == torch.uint8 and images.shape == (2, 3, 32, 32)
    assert labels.tolist() == [3, 9]
    assert images[0, 0, 0, 1] == 1      # red, row 0, col 1 = plane byte 1
    assert images[0, 0, 1, 0] == 32     # row 1, col 0 = plane byte 32
    assert images[0, 0, 8, 3] == 3      # plane byte 8 * 32 + 3 = 259 -> 259 % 256 = 3
    assert images[0, 1].eq(255).all() and images[0, 2].eq(0).all() and images[1].eq(7).all()

    (tmp_path / "short.bin").write_bytes(TWO_RECORDS[:-1])
    with pytest.raises(ValueError, match="6145 bytes, not a multiple of the 3073-byte record"):
        read_cifar_batch(tmp_path / "short.bin")
    (tmp_path / "label.bin").write_bytes(bytes([10]) + TWO_RECORDS[1:])
    with pytest.raises(ValueError, match=r"label 10 outside 0\.\.9"):
        read_cifar_batch(tmp_path / "label.bin")


def test_cifar_dataset_normalises_and_reports_the_test_set(tmp_path: Path,
                                                            fake_checksums: None) -> None:
    folder = _cifar_folder(tmp_path, "test_batch_first1000.bin")
    train, test = load_cifar10(tmp_path, download=False)
    assert len(train) == 10 and train.test_set == "data_batch_1..5.bin (10)"
    assert len(test) == 2
    assert test.test_set == "test_batch_first1000.bin (first 2 of the official test set)"
    x, y = test.get_batch([0, 1])
    assert x.dtype == torch.float32 and x.shape == (2, 3, 32, 32) and y.tolist() == [3, 9]
    # green 255 -> (1 - 0.4822) / 0.2435 = 2.126488...; blue 0 -> -0.4465 / 0.2616 = -1.706804...
    assert x[0, 1, 0, 0].item() == pytest.approx(2.126488, abs=1e-5)
    assert x[0, 2, 0, 0].item() == pytest.approx(-1.706804, abs=1e-5)
    # red 32 -> (32/255 - 0.4914) / 0.2470 = (0.125490 - 0.4914) / 0.2470 = -1.481417...
    assert x[0, 0, 1, 0].item() == pytest.approx(-1.481417, abs=1e-5)
    item_x, item_y = test[0]
    assert torch.equal(item_x, x[0]) and item_y.item() == 3
    assert torch.equal(test[-1][0], x[1])
    assert MEAN[0] == 0.4914 and STD[2] == 0.2616

    # the official test batch wins when present
    (folder / "test_batch.bin").write_bytes(TWO_RECORDS)
    full = CIFAR10(tmp_path, train=False, download=False)
    assert full.test_set == "test_batch.bin (2)" and len(full) == 2


def test_cifar_missing_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=r"(?s)data_batch_1.bin.*download=False"):
        load_cifar10(tmp_path, download=False)


def test_cifar_downloads_verifies_and_extracts_the_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_checksums: None
) -> None:
    src = _cifar_folder(tmp_path / "src", "test_batch.bin")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src, arcname="cifar-10-batches-bin")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "cifar-10-binary.tar.gz").write_bytes(buf.getvalue())
    md5 = hashlib.md5(buf.getvalue()).hexdigest()
    monkeypatch.setattr(cifar10, "ARCHIVE", RemoteFile("cifar-10-binary.tar.gz", md5=md5))
    monkeypatch.setattr(cifar10, "MIRRORS", (mirror.as_uri() + "/",))
    train, test = load_cifar10(tmp_path / "data", download=True)
    assert len(train) == 10 and test.test_set == "test_batch.bin (2)"
    assert (tmp_path / "data" / "cifar10" / "cifar-10-binary.tar.gz").is_file()
    shutil.rmtree(mirror)  # a second load reads the extracted files, no download
    assert len(CIFAR10(tmp_path / "data", train=True, download=True)) == 10


def test_real_cifar_with_the_partial_test_batch(cifar10_data: Path) -> None:
    train, test = load_cifar10(cifar10_data, download=False)
    assert len(train) == 50_000 and train.data.shape == (50_000, 3, 32, 32)
    official = (cifar10_data / "cifar10" / "cifar-10-batches-bin" / "test_batch.bin").is_file()
    if official:
        assert test.test_set == "test_batch.bin (10,000)"
    else:
        assert test.test_set == "test_batch_first1000.bin (first 1,000 of the official test set)"
        assert len(test) == 1000
    assert torch.bincount(train.targets).tolist() == [5000] * 10
    # the per-channel statistics of the training pixels are the documented MEAN and STD
    # (exact, from the per-channel histogram of the 51,200,000 pixel values of each channel)
    hist = torch.stack([torch.bincount(train.data[:, c].reshape(-1), minlength=256)
                        for c in range(3)]).double()
    value = torch.arange(256, dtype=torch.float64) / 255
    count = hist.sum(1)
    mean = (hist * value).sum(1) / count
    std = ((hist * value.square()).sum(1) / count - mean.square()).sqrt()
    assert mean.tolist() == pytest.approx(MEAN, abs=1e-4)
    assert std.tolist() == pytest.approx(STD, abs=1e-4)


# --------------------------------------------------------------------------- Shakespeare


def test_shakespeare_vocab_and_windows_by_hand() -> None:
    text = "abcdefghij" * 4  # 40 chars; vocab a..j -> ids 0..9, token k = k % 10
    train, val = split_text(text, block_size=3)
    assert train.vocab is val.vocab and train.vocab.chars == tuple("abcdefghij")
    # train = first int(0.9 * 40) = 36 tokens; stride 1: (36 - 3 - 1) // 1 + 1 = 33 windows
    assert train.tokens.tolist() == [k % 10 for k in range(36)] and len(train) == 33
    x, y = train[5]
    assert x.tolist() == [5, 6, 7] and y.tolist() == [6, 7, 8]
    x, y = train.get_batch([32, -33])  # the last window starts at 32: tokens 32..35
    assert x.tolist() == [[2, 3, 4], [0, 1, 2]] and y.tolist() == [[3, 4, 5], [1, 2, 3]]
    with pytest.raises(IndexError):
        train.get_batch([33])
    # val = last 4 tokens [6, 7, 8, 9]; stride = block_size = 3: (4 - 3 - 1) // 3 + 1 = 1 window
    assert val.tokens.tolist() == [6, 7, 8, 9] and len(val) == 1
    assert val[0][0].tolist() == [6, 7, 8] and val[0][1].tolist() == [7, 8, 9]
    # stride 2 on 36 tokens: (36 - 4) // 2 + 1 = 17 windows, window 16 starts at 32
    strided = ShakespeareChar(train.tokens, train.vocab, 3, 2, "train")
    assert len(strided) == 17 and strided[16][0].tolist() == [2, 3, 4]

    vocab = CharVocab("hello world!")
    assert "".join(vocab.chars) == " !dehlorw"
    assert vocab.encode("hello").tolist() == [4, 3, 5, 5, 6]
    assert vocab.decode(vocab.encode("world!")) == "world!"
    with pytest.raises(ValueError, match="character 'z' is not in the vocabulary"):
        vocab.encode("z")
    with pytest.raises(ValueError, match="block_size=3 needs at least 4"):
        split_text("abcdefghij" * 3, block_size=3)  # val = 3 tokens
    with pytest.raises(ValueError, match="stride=0 is invalid"):
        ShakespeareChar(train.tokens, train.vocab, 3, 0, "train")


def test_real_shakespeare(shakespeare_data: Path) -> None:
    train, val = load_shakespeare(shakespeare_data, block_size=64, download=False)
    assert len(train.vocab) == 65
    # 1,115,394 chars: train int(0.9 * 1115394) = 1,003,854 tokens, val 111,540
    assert train.tokens.numel() == 1_003_854 and val.tokens.numel() == 111_540
    assert len(train) == 1_003_854 - 64 and len(val) == (111_540 - 65) // 64 + 1 == 1742
    assert train.vocab.decode(train[0][0][:14]) == "First Citizen:"


# --------------------------------------------------------------------------- GPT


def _tiny_gpt(**kw: object) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(**{"vocab_size": 11, "block_size": 16, "n_layer": 2, "n_head": 2,
                       "n_embd": 16, **kw})  # type: ignore[arg-type]
    return GPT(cfg)


def test_gpt_is_causal() -> None:
    model = _tiny_gpt().eval()
    x = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    changed = x.clone()
    changed[:, 10] = (x[:, 10] + 1) % 11
    a, b = model.logits(x), model.logits(changed)
    assert torch.equal(a[:, :10], b[:, :10])           # earlier positions never see position 10
    assert (a[:, 10:] - b[:, 10:]).abs().amax(-1).min() > 1e-6  # positions >= 10 all do


def test_gpt_weight_tying_parameter_count_and_outputs() -> None:
    model = _tiny_gpt()
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "wte.weight" in names and "lm_head.weight" not in names
    # (V + T) * C + n_layer * (12 C^2 + 13 C) + 2 C = 27 * 16 + 2 * (3072 + 208) + 32 = 7024
    assert GPTConfig(11, 16, 2, 2, 16).num_params() == 7024
    assert sum(p.numel() for p in model.parameters()) == 7024
    assert GPTConfig(11, 16, 2, 2, 16, bias=False).num_params() == sum(
        p.numel() for p in _tiny_gpt(bias=False).parameters())
    # the tied matrix gets the gradient of both uses: zeroing the head contribution changes it
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(3))
    model.train()(( x, y))["loss"].backward()
    assert model.wte.weight.grad is not None and model.lm_head.weight.grad is model.wte.weight.grad
    # unused token ids (not in x) still get a gradient: only through the output head
    unused = sorted(set(range(11)) - set(x.flatten().tolist()))
    assert unused and model.wte.weight.grad[unused].abs().sum() > 0

    out = model.train()((x, y))
    assert set(out) == {"loss"}
    out = model.eval()((x, y))
    assert set(out) == {"loss", "perplexity"}
    assert out["perplexity"].item() == pytest.approx(math.exp(out["loss"].item()), rel=1e-6)
    # N(0, 0.02) init: logits near 0, so the loss is near ln(11) = 2.3979
    assert out["loss"].item() == pytest.approx(math.log(11), abs=0.05)


def test_gpt_config_validation_and_generate() -> None:
    with pytest.raises(ValueError, match="n_head=3 does not divide n_embd=16"):
        GPTConfig(n_head=3, n_embd=16)
    with pytest.raises(ValueError, match="n_layer=0 is invalid"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match=r"dropout=1\.0 is invalid"):
        GPTConfig(dropout=1.0)
    model = _tiny_gpt().eval()
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size=16"):
        model.logits(torch.zeros(1, 17, dtype=torch.long))
    start = torch.zeros(2, 1, dtype=torch.long)
    a = model.generate(start, 20, generator=torch.Generator().manual_seed(0))
    b = model.generate(start, 20, generator=torch.Generator().manual_seed(0))
    assert a.shape == (2, 21) and torch.equal(a, b) and a.max() < 11
    greedy = model.generate(start, 3, top_k=1)
    assert greedy[:, 1].tolist() == model.logits(start)[:, -1].argmax(-1).tolist()


# --------------------------------------------------------------------------- tasks train


@pytest.mark.parametrize("task_id", ["mnist-cnn-v0", "cifar10-cnn-v0", "shakespeare-char-gpt-v0"])
def test_each_task_builds_trains_and_evaluates(task_id: str,
                                               request: pytest.FixtureRequest) -> None:
    data_root = request.getfixturevalue(f"{task_id.split('-')[0]}_data")  # mnist_data, ...
    task = get_task(task_id)
    train, test = task.load_data(data_root, False)
    torch.manual_seed(0)
    model = task.build_model()
    result = Trainer(model, train, Subset(test, range(100))).fit(
        strategy=DiLoCo(H=2), num_nodes=2, max_steps=2, batch_size=8, eval_interval=2, seed=0,
        progress=False, network=None,
    )
    final = result.final
    assert math.isfinite(final["eval_loss"]) and result.bytes_sent[0] > 0
    if task_id.startswith("shakespeare"):
        # one eval batch of 100 windows: perplexity = exp(loss); an untrained model is near
        # ln(65) = 4.17 nats; 2 steps of AdamW at lr 1e-3 do not raise it
        assert final["eval_perplexity"] == pytest.approx(math.exp(final["eval_loss"]), rel=1e-5)
        assert 2.5 < final["eval_loss"] < math.log(65) + 0.2
    else:
        assert 0.0 <= final["eval_accuracy"] <= 1.0


def test_the_small_gpt_task_and_the_cifar_cnn_build() -> None:
    torch.manual_seed(0)
    model = TASKS["shakespeare-char-gpt-small-v0"].build_model()
    assert isinstance(model, GPT) and model.config.block_size == 256
    assert sum(p.numel() for p in model.parameters()) == 10_770_816
    cnn = CifarCNN()
    assert sum(p.numel() for p in cnn.parameters()) == 188_810
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_gpt_trains_identically_under_the_loop_and_vmap_engines() -> None:
    train, val = split_text("the quick brown fox jumps over the lazy dog! " * 40, block_size=16)
    finals = []
    for engine in ("loop", "vmap"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=len(train.vocab), block_size=16, n_layer=2, n_head=2,
                              n_embd=16))
        result = Trainer(model, train, val).fit(
            strategy=DiLoCo(H=2), num_nodes=2, max_steps=4, batch_size=4, eval_interval=4,
            seed=0, progress=False, network=None, engine=engine,
        )
        finals.append(result.final)
    assert finals[0] == pytest.approx(finals[1], rel=1e-5)
    assert set(finals[0]) == {"eval_loss", "eval_perplexity"}


def test_eval_perplexity_is_exp_of_the_mean_loss_and_the_eval_set_is_reported() -> None:
    """Perplexity over several eval batches is exp(mean loss), not the mean of exp(loss)."""
    import math

    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from exogym import Trainer

    class Losses(Dataset):
        """Sample i carries a fixed loss value; the model returns it as its loss."""

        test_set = "two hand-made samples"

        def __init__(self, values: list[float]) -> None:
            self.values = torch.tensor(values)

        def __len__(self) -> int:
            return len(self.values)

        def __getitem__(self, i: int) -> torch.Tensor:
            return self.values[i]

    class Echo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(()))

        def forward(self, batch: torch.Tensor) -> dict[str, torch.Tensor]:
            loss = batch.mean() + 0 * self.w
            return {"loss": loss, "perplexity": loss.exp()}

    # Two eval batches of one sample: losses 0 and 2. Mean loss 1 -> perplexity e (2.718...),
    # while averaging exp(loss) would give (1 + e^2) / 2 = 4.19.
    result = Trainer(Echo(), Losses([0.0, 2.0]), Losses([0.0, 2.0])).fit(
        strategy="ddp", num_nodes=1, max_steps=1, batch_size=1, eval_batch_size=1,
        network=None, progress=False)
    assert result.final["eval_loss"] == 1.0
    assert result.final["eval_perplexity"] == math.e
    assert result.eval_set == "two hand-made samples"
    assert result.to_dict()["eval_set"] == "two hand-made samples"
    assert "(on two hand-made samples)" in result.summary()
