"""Atomic file writes: a temp file in the same directory, then os.replace.

A reader (the parent merging a report, a user opening findings/) sees either
the old file or the new one, never half of one; two campaigns writing into one
report directory never see each other's temp files because each temp name is
unique (mkstemp).

Modes: mkstemp creates its file 0600, which a CI uploader or a web server
running as another user cannot read.  Report files get what ``open()`` would
give them (0666 less the umask, so 0644 usually), repro scripts 0777 less the
umask (0755): the same files a plain write would make, only atomic.

Durability: the file is fsynced before the rename and its directory after
it, so a finding reported as written survives a power loss, not just a
crash of the process.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "atomic_symlink", "current_umask",
           "FILE_MODE", "SCRIPT_MODE"]

FILE_MODE = 0o666  # before the umask, as open() would create it
SCRIPT_MODE = 0o777


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows
    (os.umask can only be read by setting it, which races other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_temp(path: str, data: bytes, mode: int) -> str:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _unlink(tmp)
        raise
    return tmp


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # not every filesystem lets a directory be opened; the file itself is synced
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str, data: bytes, *, mode: int = FILE_MODE) -> None:
    """Replace ``path`` with ``data`` atomically (mode: before the umask)."""
    tmp = _write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    _sync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write_text(path: str, text: str, *, mode: int = FILE_MODE) -> None:
    if not isinstance(text, str):
        raise TypeError(f"atomic_write_text writes a str, got {type(text).__name__}")
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_json(path: str, data: Any, *, mode: int = FILE_MODE) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n", mode=mode)


def atomic_symlink(target: str, link: str) -> None:
    """Point ``link`` at ``target`` atomically (a new link renamed over the old)."""
    directory = os.path.dirname(os.path.abspath(link))
    tmp = os.path.join(directory, f".{os.path.basename(link)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
