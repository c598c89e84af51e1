"""Where specd keeps what it builds or converts on this machine."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where converted weights and built kernels live (``$SPECD_CACHE_DIR``, else the user
    cache directory)."""
    env = os.environ.get("SPECD_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("specd"))
