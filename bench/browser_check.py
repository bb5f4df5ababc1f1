"""The documentation site as a reader sees it: headless Chromium loads the built site and checks
what a strict build cannot.

- the home page shows the main job's results as a table (not a code block of ``|`` lines), and
  the "What it does" table has a header;
- the search works: ``population`` lists the populations page among its first five results;
- an API page has no grouped-name artefact (an attribute named ``num_nodes,``);
- the feature pages open with a table of contents on the right (their sections), and no escaped
  pipe of a table shows as a backslash and a bar;
- nothing is cut at the right in a 1280-pixel window: no table, code block or API signature of
  the home page, five feature pages and three API pages is wider than its column (tables fit,
  code wraps).

Screenshots of the home page and of two feature pages are written to ``--shots`` (not
committed) for a person to look at. Chromium is Debian's package; the script installs it with
``apt-get`` when it is missing and it runs as root, and otherwise says how. It talks to the
browser through the DevTools protocol (``websocket-client``, in the ``docs`` extra).

    python bench/browser_check.py                        # builds the site, about a minute
    python bench/browser_check.py --site /tmp/site       # a site already built
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FEATURE_PAGES = ("populations", "world", "clock", "async", "ft")
SHOTS = {"home": "", "populations": "populations/", "world": "world/",
         "api-trainer": "api/trainer/"}


def chromium() -> str:
    """The browser's path, installing Debian's package when missing (as root)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    if os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], check=True)
        if path := shutil.which("chromium"):
            return path
    raise SystemExit("browser_check: no Chromium; install it (Debian: apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(site: Path) -> str:
    """Serve ``site`` on loopback in a thread; its base address."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class Browser:
    """One headless Chromium tab, driven over the DevTools protocol."""

    def __init__(self, binary: str) -> None:
        import websocket  # the docs extra

        port = free_port()
        self._profile = tempfile.mkdtemp(prefix="exogym-chromium-")
        self._proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1280,900", f"--remote-debugging-port={port}",
             f"--user-data-dir={self._profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tabs = _retry(lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json")))
        page = next(t for t in tabs if t["type"] == "page")
        self._ws = websocket.create_connection(page["webSocketDebuggerUrl"],
                                               suppress_origin=True, timeout=30)
        self._id = 0
        self.call("Page.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message["result"])

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        _retry(lambda: self.eval("document.readyState") == "complete" or None)

    def eval(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, seconds: float = 20.0) -> Any:
        """``expression``'s first truthy value, polled (None after ``seconds``)."""
        return _retry(lambda: self.eval(expression) or None, seconds, quiet=True)

    def screenshot(self, path: Path, max_height: int = 3000) -> None:
        """The page from its top, to its end or ``max_height`` pixels."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"],
                "height": min(size["height"], max_height), "scale": 1}
        data = self.call("Page.captureScreenshot", format="png", clip=clip,
                         captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        self._ws.close()
        self._proc.terminate()
        self._proc.wait(timeout=10)
        shutil.rmtree(self._profile, ignore_errors=True)


def _retry(fn: Callable[[], Any], seconds: float = 20.0, quiet: bool = False) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = fn()
            if value is not None:
                return value
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            if quiet:
                return None
            raise SystemExit(f"browser_check: gave up after {seconds:.0f} s")
        time.sleep(0.25)


# -- the checks: each returns the problems it found ---------------------------------------------
_TABLES = """Array.from(document.querySelectorAll('article table')).map(t =>
    [Array.from(t.querySelectorAll('thead th')).map(th => th.textContent.trim()),
     t.querySelectorAll('tbody tr').length])"""


def check_home(b: Browser, base: str) -> list[str]:
    b.open(base)
    tables = b.eval(_TABLES) or []
    problems = []
    if not any("eval loss" in heads and rows >= 5 for heads, rows in tables):
        problems.append(f"home: no results table (a table with 'eval loss' and >= 5 rows); "
                        f"tables seen: {tables}")
    if any(not "".join(heads) for heads, _ in tables):
        problems.append("home: a table with an empty header row")
    raw = b.eval("Array.from(document.querySelectorAll('pre')).some(p => "
                 "p.textContent.includes('| strategy |'))")
    if raw:
        problems.append("home: the results are shown as text in a code block")
    return problems


def check_search(b: Browser, base: str) -> list[str]:
    b.open(base + "?q=population")
    links = b.wait_for("(l => l.length ? l : null)(Array.from(document.querySelectorAll("
                       "'.md-search-result__item a')).map(a => a.getAttribute('href')))")
    if not links:
        meta = b.eval("document.querySelector('.md-search-result__meta')?.textContent")
        return [f"search: no results for 'population' (the search says {meta!r})"]
    first = [link.split("#")[0].rstrip("/").rsplit("/", 1)[-1] for link in links[:5]]
    if "populations" not in first:
        return [f"search: 'population' does not list the populations page in its first five "
                f"results: {links[:5]}"]
    return []


def check_api(b: Browser, base: str) -> list[str]:
    problems = []
    for page in ("api/run/", "api/sim/", "api/lab/"):
        b.open(base + page)
        grouped = b.eval("Array.from(document.querySelectorAll('article code, article span'))"
                         ".map(e => e.textContent.trim()).filter(t => /^[a-z_]+,$/.test(t))")
        if grouped:
            problems.append(f"{page}: grouped names rendered as one entry: {grouped[:5]}")
    return problems


def check_feature_pages(b: Browser, base: str) -> list[str]:
    problems = []
    for page in FEATURE_PAGES:
        b.open(f"{base}{page}/")
        toc = b.eval("document.querySelectorAll('.md-sidebar--secondary .md-nav__link').length")
        if not toc or toc < 3:
            problems.append(f"{page}: {toc or 0} sections in its table of contents (want >= 3)")
        if b.eval("document.querySelector('article').innerText.includes('\\\\|')"):
            problems.append(f"{page}: a '\\|' shown as text (a pipe escaped in a table's code)")
    return problems


# what a reader cannot see without scrolling sideways: a table, a code block or an API
# signature wider than the column it sits in (Material wraps tables in a scrolling box)
_CLIPPED = """Array.from(document.querySelectorAll(
    'article .md-typeset__scrollwrap, article pre > code, article .doc-signature'))
    .filter(e => e.scrollWidth > e.clientWidth + 2)
    .map(e => [e.className || e.tagName, e.textContent.trim().slice(0, 50),
               e.scrollWidth, e.clientWidth])"""
WIDE_PAGES = ("", "populations/", "world/", "clock/", "async/", "claims/", "devices/",
              "api/trainer/", "api/run/", "api/sim/")


def check_wide_content(b: Browser, base: str) -> list[str]:
    """Wide tables, code blocks and API signatures fit their column or wrap (at 1280 px)."""
    problems = []
    for page in WIDE_PAGES:
        b.open(base + page)
        for kind, text, wide, shown in b.eval(_CLIPPED) or []:
            problems.append(f"/{page}: a {kind} is {wide} px wide in a {shown} px column, cut "
                            f"(it starts {text!r})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build one)")
    parser.add_argument("--shots", type=Path, default=ROOT / "runs" / "browser-check",
                        help="where the screenshots go (default: runs/browser-check)")
    args = parser.parse_args(argv)
    site = args.site
    if site is None:
        site = Path(tempfile.mkdtemp(prefix="exogym-site-"))
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                        "--site-dir", str(site)], cwd=ROOT, check=True,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    base = serve(site)
    browser = Browser(chromium())
    try:
        problems = [*check_home(browser, base), *check_search(browser, base),
                    *check_api(browser, base), *check_feature_pages(browser, base),
                    *check_wide_content(browser, base)]
        args.shots.mkdir(parents=True, exist_ok=True)
        for name, page in SHOTS.items():
            browser.open(base + page)
            browser.screenshot(args.shots / f"{name}.png")
    finally:
        browser.close()
    for problem in problems:
        print(f"browser_check: {problem}")
    print(f"browser_check: {'FAILED' if problems else 'ok'}: home page, search, API pages, "
          f"{len(FEATURE_PAGES)} feature pages, wide content on {len(WIDE_PAGES)} pages; "
          f"screenshots in {args.shots}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
