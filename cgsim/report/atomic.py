"""Atomic file writes: a temp file in the same directory, then os.replace.

A reader (the parent merging a report, a user opening findings/) sees either
the old file or the new one, never half of one; two campaigns writing into one
report directory never see each other's temp files because each temp name is
unique (mkstemp).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_text", "atomic_write_json", "atomic_symlink"]


def atomic_write_text(path: str, text: str, *, mode: int | None = None) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            # fsync: a finding that was reported as written survives a crash of
            # the machine, not just of the process.
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: str, data: Any, *, mode: int | None = None) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode=mode)


def atomic_symlink(target: str, link: str) -> None:
    """Point ``link`` at ``target`` atomically (a new link renamed over the old)."""
    directory = os.path.dirname(os.path.abspath(link))
    tmp = os.path.join(directory, f".{os.path.basename(link)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
