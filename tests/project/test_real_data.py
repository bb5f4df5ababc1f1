"""How the tests get their datasets (``support/real_data.py``): the folder they read, a download
from a mirror on 127.0.0.1 checked by checksum, one skip line without data or network, a failure
instead under ``EXOGYM_REQUIRE_DATA=1``; and ``EXOGYM_DATA_MIRRORS``, which points exogym at such
a mirror."""

from __future__ import annotations

import hashlib
import shutil
import socket
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support import real_data
from support.real_data import DATASETS, REQUIRE_DATA, data_root, provide

from exogym.tasks.data import cifar10, mnist, shakespeare
from exogym.tasks.data.download import MIRRORS_ENV_VAR, RemoteFile, ensure_files, mirrors_for
from exogym.tasks.data.paths import ENV_VAR


class Mirror:
    """An HTTP server on 127.0.0.1 serving ``folder``; ``requests`` lists the paths asked for."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.requests: list[str] = []
        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(folder), **kwargs)

            def do_GET(self) -> None:
                requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: Any) -> None:  # no access log on stderr
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def serve(self, rel: str, data: bytes) -> None:
        """Serve ``data`` at ``<url>/<rel>``."""
        path = self.folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    served = tmp_path / "mirror"
    served.mkdir()
    m = Mirror(served)
    yield m
    m.close()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> str:
    """A port on 127.0.0.1 nothing listens on, as every dataset's official source: a machine
    without a network. Returns its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{s.getsockname()[1]}/"
    for module in (mnist, cifar10, shakespeare):
        monkeypatch.setattr(module, "MIRRORS", (nowhere,))
    monkeypatch.delenv(REQUIRE_DATA, raising=False)
    return nowhere


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


# -- the folder ---------------------------------------------------------------------------------
def test_the_folder_is_the_variable_then_the_checkout_s_neighbour_then_the_user_s(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "data"
    shared.mkdir(parents=True)
    monkeypatch.setattr(real_data, "SHARED_DATA", shared)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "mine"))
    assert data_root() == tmp_path / "mine"
    monkeypatch.setenv(ENV_VAR, "")  # empty counts as unset, as for exogym
    assert data_root() == shared
    shared.rmdir()
    assert data_root() == tmp_path / "cache" / "exogym" / "data"


# -- a download from a mirror on 127.0.0.1 ------------------------------------------------------
def test_missing_data_is_fetched_once_from_a_local_http_server(
        mirror: Mirror, offline: str, tmp_path: Path, mnist_data: Path,
        shakespeare_data: Path) -> None:
    """A copy of the tests' own MNIST and Tiny Shakespeare, served over HTTP, lands in an empty
    data folder, checked against the official checksums; a second call asks for nothing."""
    for name in ("mnist", "shakespeare"):
        folder = DATASETS[name].folder
        shutil.copytree((mnist_data if name == "mnist" else shakespeare_data) / folder,
                        mirror.folder / folder)
    root = tmp_path / "data"
    assert provide("mnist", root, mirror.url) == root
    assert provide("shakespeare", root, mirror.url) == root
    assert mirror.requests == [*(f"/mnist/{f.name}" for f in mnist.FILES),
                               "/tinyshakespeare/input.txt"]
    ensure_files(root / "mnist", mnist.FILES, [], dataset="mnist", download=False)  # verified
    ensure_files(root / "tinyshakespeare", [shakespeare.FILE], [], dataset="tinyshakespeare",
                 download=False)
    assert provide("mnist", root, offline) == root and len(mirror.requests) == 5  # present


def test_a_file_with_a_wrong_checksum_is_refused_and_not_left_behind(
        mirror: Mirror, offline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mirror.serve("tinyshakespeare/input.txt", b"First Citizen: not the corpus\n")
    root = tmp_path / "data"
    with pytest.raises(pytest.skip.Exception):
        provide("shakespeare", root, mirror.url)
    assert mirror.requests == ["/tinyshakespeare/input.txt"]
    assert _leftovers(root) == ["tinyshakespeare"]  # the folder, empty: no file, no .part
    monkeypatch.setenv(REQUIRE_DATA, "1")  # the failure tells why
    with pytest.raises(pytest.fail.Exception, match=r"input.txt: ChecksumError: checksum "
                                                    r"mismatch: sha256 [0-9a-f]{64} \(expected "
                                                    f"{shakespeare.FILE.sha256[:32]}"):
        provide("shakespeare", root, mirror.url)
    assert _leftovers(root) == ["tinyshakespeare"]


TWO_RECORDS = bytes(3073) + bytes([9]) + bytes(3072)  # two CIFAR-10 records, labels 0 and 9


def test_cifar_batches_are_fetched_one_by_one_from_a_mirror(
        mirror: Mirror, offline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mirror laid out like a data folder serves the batch files themselves (the official
    source serves only the whole archive): each is checked, the official test batch is asked for
    first, its first 1,000 records accepted instead."""
    digest = hashlib.sha256(TWO_RECORDS).hexdigest()
    monkeypatch.setattr(cifar10, "BATCH_FILES", {  # every file is TWO_RECORDS here
        name: (2, RemoteFile(name, sha256=digest)) for name in cifar10.BATCH_FILES})
    for name in (*cifar10.TRAIN_FILES, cifar10.PARTIAL_TEST_FILE):
        mirror.serve(f"cifar10/cifar-10-batches-bin/{name}", TWO_RECORDS)
    root = tmp_path / "data"
    assert provide("cifar10", root, mirror.url) == root
    batches = "/cifar10/cifar-10-batches-bin/"
    assert mirror.requests == [*(batches + n for n in cifar10.TRAIN_FILES),
                               batches + cifar10.TEST_FILE, batches + cifar10.PARTIAL_TEST_FILE]
    train, test = cifar10.load_cifar10(root, download=False)
    assert len(train) == 10 and test.test_set.startswith(cifar10.PARTIAL_TEST_FILE)
    assert not (root / "cifar10" / cifar10.ARCHIVE.name).exists()


# -- no data, no network ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(DATASETS))
def test_without_data_or_network_the_test_is_skipped_with_one_line(
        name: str, offline: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "data"
    with pytest.raises(pytest.skip.Exception) as skipped:
        provide(name, root, offline)
    line = skipped.value.msg
    folder = DATASETS[name].folder
    assert line == (f"{name} data missing from {root / folder} and downloading it failed: set "
                    f"EXOGYM_DATA_DIR to a folder holding {folder}/ ({DATASETS[name].what}), or "
                    f"run the tests once online to fetch {DATASETS[name].download} into {root} "
                    "(EXOGYM_REQUIRE_DATA=1 says why)")
    assert "\n" not in line
    monkeypatch.setenv(REQUIRE_DATA, "1")  # CI: a failure, with what was tried
    with pytest.raises(pytest.fail.Exception) as failed:
        provide(name, root, offline)
    first, *why = failed.value.msg.splitlines()
    assert first == line and any(offline in w and "URLError" in w for w in why)


def test_require_data_takes_0_or_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_DATA, "yes")
    with pytest.raises(ValueError, match=r"EXOGYM_REQUIRE_DATA='yes': expected 1 \(a missing "
                                         r"dataset fails the tests that read it\) or 0"):
        provide("mnist", tmp_path, "")
    monkeypatch.setenv(REQUIRE_DATA, "0")
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("present: not fetched, not read")
    assert provide("shakespeare", tmp_path, "") == tmp_path


# -- EXOGYM_DATA_MIRRORS ------------------------------------------------------------------------
def test_mirrors_come_before_the_official_sources_and_are_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MIRRORS_ENV_VAR, raising=False)
    assert mirrors_for("mnist", mnist.MIRRORS) == mnist.MIRRORS
    monkeypatch.setenv(MIRRORS_ENV_VAR, " http://127.0.0.1:8000  file:///srv/data/ ")
    assert mirrors_for("cifar10/cifar-10-batches-bin", ("https://x.org/",)) == (
        "http://127.0.0.1:8000/cifar10/cifar-10-batches-bin/",
        "file:///srv/data/cifar10/cifar-10-batches-bin/", "https://x.org/")
    for bad in ("127.0.0.1:8000", "ftp://host/data", "http:///data", "file://"):
        monkeypatch.setenv(MIRRORS_ENV_VAR, f"https://ok.org/ {bad}")
        with pytest.raises(ValueError, match=f"EXOGYM_DATA_MIRRORS: '{bad}' is not a mirror URL; "
                                             r"expected http://HOST/\.\.\., https://HOST/"):
            mirrors_for("mnist", mnist.MIRRORS)
