"""Lightning's TensorBoardLogger continued across attempts: one version dir for all of them.

Without a `version=` the logger takes the next free `version_N` under its root at every start, so
each attempt would be a run of its own in TensorBoard (and the purge_step its SummaryWriter gets
could not reach the dead attempt's events). The first attempt's version is recorded in the run dir
per root; a later attempt's logger of the same root takes it again.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from ..rundir import TB_VERSION, claim
from .._session.messages import describe, say
from . import point

__all__ = ["patch"]

_MARK = "__resilient_continued__"


def patch(module: Any) -> None:
    """Wrap ``module.TensorBoardLogger``'s choice of the next version (lightning.pytorch's, fabric's)."""
    try:
        cls = module.TensorBoardLogger
        orig = vars(cls)["_get_next_version"]   # each of the two classes has its own
        if getattr(orig, _MARK, False):
            return
    except Exception as e:
        say(f"warning: trackers: Lightning's TensorBoardLogger not continued across restarts: {describe(e)}")
        return

    @functools.wraps(orig)
    def next_version(self: Any) -> Any:
        version = orig(self)
        try:
            return _shared_version(os.path.abspath(self.root_dir), version)
        except Exception as e:  # the logger's own choice stands
            say(f"warning: trackers: TensorBoardLogger version not shared with the other attempts: {describe(e)}")
            return version

    setattr(next_version, _MARK, True)
    setattr(cls, "_get_next_version", next_version)


def _shared_version(root: str, version: int) -> int:
    rd = point.run_dir()
    if rd is None:
        return version
    first, _, first_root = claim(rd, TB_VERSION, f"{version} {root}").partition(" ")
    return int(first) if first_root == root else version
