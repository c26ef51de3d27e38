"""Where the training code came from: the script's path and its git commit (recorded in manifests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

__all__ = ["script_path", "git_info"]


def script_path() -> Optional[Path]:
    main = sys.modules.get("__main__")
    f = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c") else None)
    return Path(f).resolve() if f else None


def git_info(directory: Optional[Path], timeout: float = 2.0) -> tuple[Optional[str], Optional[bool]]:
    """(commit, dirty) of the repository containing `directory`; (None, None) when not a repo."""
    if directory is None:
        return None, None
    try:
        head = subprocess.run(["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=timeout)
        if head.returncode != 0:
            return None, None
        commit = head.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None, None
    try:
        st = subprocess.run(["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=timeout)
        dirty: Optional[bool] = bool(st.stdout.strip()) if st.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        dirty = None
    return commit, dirty


