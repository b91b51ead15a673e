"""Writing the files convgen makes (emitted sources, the catalogue, exported tuning records) as
``open(path, "w")`` would, but atomically, and refusing what must not be written over."""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path


class EmitError(OSError):
    """A file convgen writes could not be written; ``str()`` is one line, ``cannot write <path>:
    <reason>``."""


_NOT_REGULAR = ((stat.S_ISDIR, "it is a directory"),
                (stat.S_ISCHR, "it is a character device; emit writes regular files only (give a file path)"),
                (stat.S_ISBLK, "it is a block device; emit writes regular files only (give a file path)"),
                (stat.S_ISFIFO, "it is a FIFO (named pipe); emit writes regular files only (give a file path)"),
                (stat.S_ISSOCK, "it is a socket; emit writes regular files only (give a file path)"))


def write_error(shown: str, reason: str, cause: OSError | None = None) -> EmitError:
    error = EmitError(f"cannot write {shown or repr(shown)}: {reason}")
    error.errno = getattr(cause, "errno", None)
    return error


def _umask() -> int:
    """The process umask: from /proc when it says (no window where it is 0 for other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0)
    os.umask(old)
    return old


def _reason(err: OSError, folder: Path) -> str:
    """A reason a user can act on: which folder refused, or which path component is a file."""
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        existing = next((p for p in [folder, *folder.parents] if p.exists()), folder)
        return f"the folder {existing} is not writable ({err.strerror})"
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        for parent in reversed([folder, *folder.parents]):
            if parent.is_file():
                return f"{parent} is a regular file, not a folder"
            if parent.exists() and not parent.is_dir():
                return f"{parent} is not a folder"
    return err.strerror or str(err)


def _same_bytes(target: Path, size: int, data: bytes) -> bool:
    """Whether ``target`` already holds ``data``; an unreadable file counts as different."""
    if size != len(data):
        return False
    try:
        with open(target, "rb") as existing:
            return existing.read() == data
    except OSError:
        return False


def write_if_changed(path: str | os.PathLike, text: str) -> bool:
    """Write ``text`` (UTF-8) to ``path`` as ``open(path, "w")`` would, only when the bytes differ;
    returns whether it wrote.

    Like ``open``: it writes through symlinks (the link stays a link), an existing file keeps its
    permission bits and a new one gets ``0o666 & ~umask``.  Unlike ``open``: the file is replaced
    atomically (temp beside the real target, fsync, rename), so a failure never leaves a partial
    file, and device files, FIFOs, sockets and directories are refused before anything is touched.
    Every failure is an ``EmitError`` with a one-line message; the temporary is always removed.
    """
    shown = os.fspath(path)
    if shown == "":
        raise write_error(shown, "an empty path")
    data = text.encode("utf-8")
    target = Path(os.path.realpath(shown))
    folder = target.parent
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except PermissionError as err:
        raise write_error(shown, f"the folder {folder} cannot be searched ({err.strerror})", err) from err
    except OSError as err:
        raise write_error(shown, _reason(err, folder), err) from err
    if info is not None:
        for test, reason in _NOT_REGULAR:
            if test(info.st_mode):
                raise write_error(shown, reason)
        if _same_bytes(target, info.st_size, data):
            return False
        mode = info.st_mode & 0o777
    else:
        mode = 0o666 & ~_umask()
        if os.path.islink(shown) and not folder.is_dir():
            raise write_error(shown, f"it is a symlink to {target}, whose folder {folder} does not exist")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=".emit-", dir=folder)
    except OSError as err:
        raise write_error(shown, _reason(err, folder), err) from err
    try:
        try:
            os.fchmod(handle, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(handle, view):]
            os.fsync(handle)
        finally:
            os.close(handle)
        os.replace(temp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(err, OSError):
            raise write_error(shown, _reason(err, folder), err) from err
        raise
    return True


def check_output_folder(folder: str | os.PathLike) -> None:
    """Refuse, before any work, a folder that ``write_if_changed`` could not write files into (the
    demo's ``--out``): the nearest existing folder on its path is probed with a temporary file, made
    as the writer makes one and removed at once, so that nothing is left behind either way."""
    shown = os.fspath(folder)
    if shown == "":
        raise write_error(shown, "an empty path")
    target = Path(os.path.realpath(shown))
    existing = next(p for p in [target, *target.parents] if p.exists())
    if not existing.is_dir():
        raise write_error(shown, f"{existing} is {'a regular file' if existing.is_file() else 'not a folder'}, "
                          "not a folder")
    try:
        handle, temp = tempfile.mkstemp(prefix=".emit-", dir=existing)
    except OSError as err:
        raise write_error(shown, _reason(err, existing), err) from err
    os.close(handle)
    os.unlink(temp)
