"""MkDocs hook for the notebook pages (docs/notebooks/*.ipynb, links to the files in notebooks/, rendered
by mkdocs-jupyter):

* a link or image in a notebook's markdown that points into the docs folder the way GitHub resolves it
  from notebooks/ (``../docs/images/tuner.png``) is made relative to the page's URL, since
  mkdocs-jupyter leaves a notebook's links as they are; a target missing from the site is a warning
  (an error under ``strict``);
* each page gets a download button for its ``.ipynb``, which mkdocs-jupyter's ``include_source``
  copies beside the page (``page.nb_url``), where the edit button of a markdown page would be.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.utils import get_relative_url

log = logging.getLogger("mkdocs.hooks.notebooks")
_INTO_DOCS = re.compile(r'(\b(?:src|href)=")\.\./docs/([^"#?]+)')


def _download_icon() -> str:
    import material

    icon = Path(material.__file__).parent / "templates" / ".icons" / "material" / "download.svg"
    return icon.read_text() if icon.is_file() else "Download"


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def relative(match: re.Match) -> str:
        target = match[2]
        if files.get_file_from_path(target) is None:
            log.warning("%s links to ../docs/%s, which is not in the site", page.file.src_uri, target)
        return match[1] + get_relative_url(target, page.url)

    name = Path(page.file.src_uri).name
    button = (f'<a href="{name}" download title="Download the notebook ({name})" '
              f'class="md-content__button md-icon">{_download_icon()}</a>\n')
    return button + _INTO_DOCS.sub(relative, html)
