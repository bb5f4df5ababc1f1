"""MkDocs hooks (mkdocs.yml, ``hooks:``): the site's home page is the README itself, and the
docstrings' Sphinx roles read as plain code.

``docs/index.md`` holds only a marker; its text is README.md's, with the README's links made the
site's: ``docs/PAGE.md`` becomes ``PAGE.md``, and a link to a file outside ``docs/`` (an example,
CONTRIBUTING.md, LICENSE) becomes its text, a path the reader finds in the repository. So the
first screen is written once, and the site's strict build checks its links like any page's.

The docstrings name objects the Sphinx way (``:class:`Network```, ``:func:`~a.b.c```), which
``help()`` and editors show as they are; on the API pages the role is dropped and the name kept
as code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
MARKER = "<!-- the README: mkdocs_hooks.py -->"
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>~?")
_LINK = re.compile(r"(!?)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")


def site_links(markdown: str) -> str:
    """``markdown`` (the README's) with its links pointing where they lead on the site."""

    def one(m: re.Match[str]) -> str:
        target = m.group("target")
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return m.group(0)  # a web address or an anchor of the same page
        if target.startswith("docs/"):
            return f"{m.group(1)}[{m.group('text')}]({target[len('docs/'):]})"
        return m.group("text")  # a file of the repository outside the site: its path as text

    return _LINK.sub(one, markdown)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The home page's text: the README's, its links the site's (MkDocs' hook signature)."""
    if MARKER not in markdown:
        return markdown
    return site_links((ROOT / "README.md").read_text(encoding="utf-8"))


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """The page's HTML with the docstrings' Sphinx roles dropped (MkDocs' hook signature)."""
    return _ROLE.sub("<code>", html)
