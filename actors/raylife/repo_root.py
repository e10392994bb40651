"""The repository root and the import path every process of a local Ray shares.

``sessionray serve`` runs from a checkout (or an installed copy); the Ray workers it starts, the
head's keeper (``python -m actors.raylife.keeper``) and the business tools named by
``ai.python_tools`` (such as ``examples.bot.bot_tools``) import from the same root. Kept in the
Ray-life wing because the local head, its keeper and the pre-flight all need it and the
pre-flight sits above this wing.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["REPO_ROOT", "ensure_repo_root_on_path"]

REPO_ROOT = str(Path(__file__).resolve().parents[2])
"""The repository root: on the import path of ``sessionray serve`` and of every Ray worker."""


def ensure_repo_root_on_path() -> None:
    """Put :data:`REPO_ROOT` first on ``sys.path`` (Ray workers get it on ``PYTHONPATH``), so
    ``ai.python_tools`` such as ``examples.bot.bot_tools`` import here as in the actors."""
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
