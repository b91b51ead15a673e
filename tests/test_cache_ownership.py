"""The kernel cache owns only its entries: info counts them, clear removes them and nothing else,
and a clear that could not remove them all says so instead of reporting success."""
import errno
import os
import time
from pathlib import Path

import pytest

from codegen.compile import ENTRY_MAGIC, STALE_TEMP_SECONDS, CacheError, CompiledKernel, KernelCache

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
KEYS = [f"{index:064x}" for index in (1, 2, 3)]


def put(cache, key):
    cache.write_disk(CompiledKernel(key=key, arch="sm_90", cubin=b"\x7fELF cubin " + key.encode(), log=""))
    return cache.directory / f"{key}.cubin"


def foreign_files(folder):
    """Files that look like the cache's but are not convgen's: each must survive clear."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "notes.cubin": ENTRY_MAGIC + b"named wrong",
        f"{'a' * 64}.cubin": b"no magic here",
        f"{'A' * 64}.cubin": ENTRY_MAGIC + b"upper-case hex is not ours",
        "other.txt": b"hello",
        ".tmp-abcdefgh": b"someone else's temporary",
        ".tmp-notmkstempname": ENTRY_MAGIC,
        "tuning.json": b"{}",
    }
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    (folder / "sub").mkdir()
    (folder / f"{'b' * 64}.cubin").symlink_to(folder / "notes.cubin")
    return sorted([*files, "sub", f"{'b' * 64}.cubin"])


def test_info_counts_only_convgen_entries(tmp_path):
    cache = KernelCache(tmp_path / "c")
    foreign = foreign_files(cache.directory)
    entries = [put(cache, key) for key in KEYS]
    info = cache.info()
    assert info["entries"] == 3 and info["bytes"] == sum(path.stat().st_size for path in entries)
    assert info["foreign"] == len(foreign) and info["directory"] == str(cache.directory) and info["in_memory"] == 0


def test_clear_removes_entries_and_temporaries_but_no_foreign_file(tmp_path):
    cache = KernelCache(tmp_path / "c")
    foreign = foreign_files(cache.directory)
    for key in KEYS:
        put(cache, key)
    (cache.directory / ".tmp-k3y_0abc").write_bytes(ENTRY_MAGIC + b"half-written entry")
    stale = cache.directory / ".tmp-zzzzzzzz"
    stale.write_bytes(b"")
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    (cache.directory / ".tmp-yyyyyyyy").write_bytes(b"")
    assert cache.clear() == 5
    assert sorted(os.listdir(cache.directory)) == sorted([*foreign, ".tmp-yyyyyyyy"])
    assert cache.info()["entries"] == 0 and (cache.directory / "other.txt").read_bytes() == b"hello"


def test_clear_empties_memory_too(tmp_path):
    cache = KernelCache(tmp_path / "c")
    cache.put_memory(CompiledKernel(key=KEYS[0], arch="sm_90", cubin=b"x", log=""))
    assert cache.clear() == 0 and cache.info()["in_memory"] == 0


def test_clear_and_info_on_a_missing_folder(tmp_path):
    cache = KernelCache(tmp_path / "missing")
    assert cache.clear() == 0
    assert cache.info()["entries"] == 0 and cache.info()["foreign"] == 0
    assert not (tmp_path / "missing").exists()


def test_a_failed_removal_raises_naming_the_counts(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path / "c")
    foreign_files(cache.directory)
    entries = [put(cache, key) for key in KEYS]
    real_unlink = Path.unlink

    def refuse_some(path, *args, **kwargs):
        if path.name != entries[0].name:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse_some)
    with pytest.raises(CacheError, match=rf"^removed 1 of 3 entries from {cache.directory}: "
                                         r"2 could not be removed \(Permission denied\)$"):
        cache.clear()
    monkeypatch.undo()
    assert not entries[0].exists() and entries[1].exists() and entries[2].exists()
    assert cache.info()["entries"] == 2


def test_an_unreadable_folder_raises(tmp_path, monkeypatch):
    cache = KernelCache(tmp_path / "c")
    put(cache, KEYS[0])

    def refuse(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(os, "scandir", refuse)
    with pytest.raises(CacheError, match=rf"^cannot read the cache folder {cache.directory} \(Permission denied\)$"):
        cache.clear()
    with pytest.raises(CacheError, match="cannot read the cache folder"):
        cache.info()


@pytest.mark.skipif(ROOT or not hasattr(os, "geteuid"), reason="root removes files from read-only folders")
def test_a_read_only_folder_for_real(tmp_path):
    cache = KernelCache(tmp_path / "c")
    entries = [put(cache, key) for key in KEYS]
    cache.directory.chmod(0o555)
    try:
        with pytest.raises(CacheError, match=r"^removed 0 of 3 entries from .*: 3 could not be removed "
                                             r"\(Permission denied\)$"):
            cache.clear()
    finally:
        cache.directory.chmod(0o755)
    assert all(path.exists() for path in entries)


def test_cache_error_is_an_oserror():
    assert issubclass(CacheError, OSError)
