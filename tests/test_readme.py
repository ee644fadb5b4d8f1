"""README.md: the link to the book online is where the workflow publishes it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import reader_notebooks as rn  # noqa: E402


def test_readme_links_the_book_where_pages_publishes_it():
    """GitHub Pages serves a project repository's site at https://ORG.github.io/REPO/; the
    repository is the one _config.yml names, and the workflow deploys _build/html there."""
    url, _branch = rn.repository(rn.read_config())
    online = rn.pages_url(url)
    assert online.startswith("https://") and online.endswith(".github.io/" + url.split("/")[-1] + "/")
    assert f"<{online}>" in (ROOT / "README.md").read_text()
    workflow = (ROOT / ".github" / "workflows" / "book.yml").read_text()
    assert "actions/upload-pages-artifact" in workflow and "path: _build/html" in workflow
    assert "actions/deploy-pages" in workflow
    # the address follows the repository: another one gives another address
    assert rn.pages_url("https://github.com/Someone/other-book") != online
