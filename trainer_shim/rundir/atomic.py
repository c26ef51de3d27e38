"""Atomic, optionally durable file writes and tolerant JSON reads."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ContractError

__all__ = ["fsync_dir", "atomic_write_bytes", "atomic_write_json", "read_json", "exchange"]


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside `path` survive a power cut (the file's own fsync is not enough)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Write via a temp file in the same dir and rename, so readers never see a torn file.

    `durable` fsyncs the file and its directory; heartbeats skip it (they are rewritten every
    second and a lost one after a power cut is harmless).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode(), durable=durable)


def read_json(path: Path) -> Any:
    """Parse a JSON file; ContractError (one line) if missing, unreadable or malformed."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise ContractError(f"{path}: missing") from e
    except OSError as e:
        raise ContractError(f"{path}: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise ContractError(f"{path}: not valid JSON ({e})") from e


_RENAME_EXCHANGE = 2


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False when
    the kernel, libc or filesystem cannot, and then nothing was changed."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), _RENAME_EXCHANGE)
    return rc == 0
