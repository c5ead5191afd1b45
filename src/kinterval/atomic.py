"""Atomic writes of result files: a killed run leaves the old file or the new one, never a torn one.

Each file is written to a temporary file in its own folder (``.<name>.<pid>.tmp``: hidden, no reader's
pattern matches it, and two processes writing one file never share it: the last rename wins, whole), flushed
and fsynced, and then renamed over the final path with :func:`os.replace`. A kill leaves the temporary file
behind; the next write of the same file removes those of processes no longer running, and readers of a
folder (the gate, the merge) pass over them (:func:`is_temp`). A result of several files needs an order on
top of this (delete the file that marks the set as complete first, write it last); the callers say theirs.

No kinterval imports: every layer may use it.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

# A file system that refuses a read or write (a full disk, a quota, a read-only folder, a failing disk): not a
# bug and not bad input. The command line reports it as one line naming the file (exit status 1); the suite
# runner stops at it rather than starting runs that would fail alike.
SYSTEM_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)


def system_error_message(err: OSError) -> str:
    """One line for an ``OSError`` of :data:`SYSTEM_ERRNOS`: the file and the system's reason."""
    reason = err.strerror or str(err)
    where = f"{err.filename}: " if err.filename is not None else ""
    return f"{where}{reason} ({errno.errorcode.get(err.errno, err.errno)})"


def temp_path(path: str | Path) -> Path:
    """The temporary file :func:`write_with` writes ``path`` through in this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def is_temp(name: str) -> bool:
    """Whether a file name is one of :func:`temp_path`'s (or an older kinterval's ``.<name>.tmp``)."""
    return name.startswith(".") and name.endswith(".tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def remove_stale_temps(path: str | Path) -> None:
    """Remove the temporary files of ``path`` left by killed writers (their process is gone)."""
    path = Path(path)
    for p in path.parent.glob(f".{glob.escape(path.name)}.*tmp"):
        pid = p.name[len(path.name) + 2 : -len(".tmp")].rstrip(".")
        if pid == "" or (pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid))):
            with contextlib.suppress(OSError):
                p.unlink()


@contextlib.contextmanager
def naming(path: str | Path, temp: str | Path | None = None) -> Iterator[None]:
    """An ``OSError`` without a file name raised inside (a write or a close cut short: a full disk fails
    at the flush, and Python names no file then), or one naming ``temp`` (the hidden file ``path`` is written
    through: a read-only folder refuses to create it), is raised again naming ``path``, so the command's
    error line says which file could not be written."""
    try:
        yield
    except OSError as err:
        named = None if err.filename is None else str(err.filename)  # a Path when a Path was opened
        if err.errno is None or named not in (None, None if temp is None else str(temp)):
            raise
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


def write_with(path: str | Path, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a binary file object, then put what it wrote at ``path`` atomically (e.g.
    ``write_with(p, lambda fh: np.savez(fh, **arrays))``: a file object, so numpy appends no ``.npz``).
    On an exception nothing is left behind and ``path`` is untouched; an ``OSError`` names ``path``."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with naming(path, tmp):
            with open(tmp, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        remove_stale_temps(path)
    except BaseException:
        with contextlib.suppress(OSError):  # a read-only folder refuses even this; the first error tells
            tmp.unlink(missing_ok=True)
        raise
    return path


def check_target(path: str | Path, flag: str = "--json", inputs=()) -> None:
    """``ValueError`` (one line naming ``flag``) when a file cannot be written at ``path``: a folder stands
    there, or its folder does not exist, or it lies in one of the ``inputs`` (folders the command reads,
    whose files it would replace). Commands call it before their work, not after."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a directory; give a file name")
    if not path.parent.is_dir():
        if any(p.is_file() for p in path.parents):
            raise ValueError(f"{flag} {path}: a part of this path is a file")
        raise ValueError(f"{flag} {path}: the folder {path.parent} does not exist")
    for folder in inputs:
        if Path(folder).is_dir() and path.resolve().is_relative_to(Path(folder).resolve()):
            raise ValueError(f"{flag} {path}: inside {folder}, an input of this command; write it elsewhere")


def write_bytes(path: str | Path, data: bytes) -> Path:
    return write_with(path, lambda fh: fh.write(data))


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | Path, obj, *, indent: int | None = 1, default=None) -> Path:
    """``obj`` as JSON (``json.dumps(obj, indent=indent, default=default)`` and a newline)."""
    return write_text(path, json.dumps(obj, indent=indent, default=default) + "\n")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive(lock: str | Path, busy: str, remove: bool = False) -> Iterator[None]:
    """One process at a time holds ``lock`` (its folder is made, and with ``remove`` removed again if it
    stays empty): an advisory ``flock``, released by the kernel when its process dies, so a killed process
    leaves no stale lock. A second process gets a
    ``ValueError`` of ``busy`` with ``{who}`` filled in (``pid N on HOST``, as the holder wrote it).
    ``remove``: the lock file goes when the holder is done (a process that opened it just before finds, once
    it holds it, that it is not the file at ``lock`` any more, and is refused too). On a file system without
    locks (some NFS mounts) the caller goes on unlocked."""
    import fcntl

    lock = Path(lock)
    made = [d for d in (lock.parent, *lock.parent.parents) if not d.exists()]  # innermost first
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if remove and os.fstat(fh.fileno()).st_ino != _inode(lock):  # removed by its last holder
                raise BlockingIOError
        except BlockingIOError:
            fh.seek(0)
            raise ValueError(busy.replace("{who}", fh.read().strip() or "another process")) from None
        except OSError:
            pass  # no locks on this file system
        fh.truncate(0)
        with naming(lock):  # unbuffered: a full disk fails here, naming the file
            os.write(fh.fileno(), f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
        try:
            yield
        finally:
            if remove:
                lock.unlink(missing_ok=True)  # still held: nobody else holds the file at this path
                # folders made for the lock alone (the caller stopped before writing) go too
                with contextlib.suppress(OSError):  # not empty: the caller's output stays
                    for d in made:
                        d.rmdir()


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
