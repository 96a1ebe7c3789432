"""A griffe extension for the API pages: the docstrings' Sphinx roles read as code.

kvledger's docstrings name things the Sphinx way (``:class:`Ledger```, ``:meth:`~kvledger.x.Y.z```); the
Markdown renderer would show the role as text. This turns each into inline code of the name (the last
component when the target starts with ``~``), the way a reader of the source sees it. Loaded by
``mkdocs.yml`` (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|obj|exc|const):`(~?)([^`<]+?)(?:\s*<[^`]*>)?`")


def _code(match: re.Match[str]) -> str:
    tilde, target = match.group(1), match.group(2).strip()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
