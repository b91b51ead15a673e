"""emit writes files as other tools do: through symlinks, with open()'s modes, atomically, never over a
device or a folder, and every failure is one EmitError line with no temporary left behind."""
import errno
import importlib
import os
import stat

import pytest

from codegen.emit import emit
from codegen.files import EmitError, write_if_changed
from codegen.spec import ConvSpec

TEXT = "// convgen kernel\nint x;\n"
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
files_module = importlib.import_module("codegen.files")
SPEC = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=1, input_size=(8, 8), filter_size=3, padding=1, dpitch=4)


def strays(*folders):
    """Temporaries emit left in ``folders``: there must never be any."""
    return [name for folder in folders for name in os.listdir(folder) if name.startswith(".emit-")]


@pytest.fixture
def umask():
    """Set the umask for one test, restoring the process's own afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def test_a_new_file_is_written_and_reported(tmp_path):
    target = tmp_path / "k.cu"
    assert write_if_changed(target, TEXT) is True
    assert target.read_text() == TEXT and not strays(tmp_path)


def test_missing_parent_folders_are_created(tmp_path):
    target = tmp_path / "a" / "b" / "k.cu"
    assert write_if_changed(str(target), TEXT) is True
    assert target.read_text() == TEXT and not strays(target.parent)


def test_unchanged_content_is_not_rewritten(tmp_path):
    target = tmp_path / "k.cu"
    target.write_text(TEXT)
    os.utime(target, (1_000_000, 1_000_000))
    assert write_if_changed(target, TEXT) is False
    assert target.stat().st_mtime == 1_000_000 and not strays(tmp_path)


def test_an_existing_binary_file_is_simply_overwritten(tmp_path):
    target = tmp_path / "k.cu"
    target.write_bytes(b"\xff\xfe\x00\x81 not utf-8")
    assert write_if_changed(target, TEXT) is True
    assert target.read_text() == TEXT and not strays(tmp_path)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_new_file_gets_the_mode_open_would_give(tmp_path, umask, mask):
    umask(mask)
    target = tmp_path / "k.cu"
    write_if_changed(target, TEXT)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask


def test_an_existing_file_keeps_its_mode(tmp_path, umask):
    umask(0o077)
    target = tmp_path / "k.cu"
    target.write_text("old")
    target.chmod(0o644)
    write_if_changed(target, TEXT)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 and target.read_text() == TEXT


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    real_dir, link_dir = tmp_path / "real", tmp_path / "links"
    real_dir.mkdir()
    link_dir.mkdir()
    real = real_dir / "k.cu"
    real.write_text("old")
    real.chmod(0o640)
    link = link_dir / "k.cu"
    link.symlink_to(os.path.join("..", "real", "k.cu"))
    assert write_if_changed(link, TEXT) is True
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "real", "k.cu")
    assert real.read_text() == TEXT and stat.S_IMODE(real.stat().st_mode) == 0o640
    assert not strays(real_dir, link_dir)


def test_a_dangling_symlink_writes_the_file_it_points_to(tmp_path):
    link = tmp_path / "k.cu"
    link.symlink_to(tmp_path / "target.cu")
    assert write_if_changed(link, TEXT) is True
    assert link.is_symlink() and (tmp_path / "target.cu").read_text() == TEXT and not strays(tmp_path)


def test_a_dangling_symlink_into_a_missing_folder_is_refused(tmp_path):
    link = tmp_path / "k.cu"
    link.symlink_to(tmp_path / "gone" / "target.cu")
    with pytest.raises(EmitError, match=r"symlink to .*target\.cu, whose folder .*gone does not exist"):
        write_if_changed(link, TEXT)
    assert link.is_symlink() and not (tmp_path / "gone").exists() and not strays(tmp_path)


def _node(tmp_path, make):
    path = tmp_path / "node"
    try:
        make(path)
    except (PermissionError, OSError) as err:
        pytest.skip(f"cannot make a special file here: {err}")
    return path


@pytest.mark.parametrize("kind, make, check, reason", [
    ("char device", lambda p: os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3)), stat.S_ISCHR,
     "it is a character device; emit writes regular files only"),
    ("fifo", lambda p: os.mkfifo(p), stat.S_ISFIFO, r"it is a FIFO \(named pipe\); emit writes regular files only"),
])
def test_special_files_are_left_alone(tmp_path, kind, make, check, reason):
    node = _node(tmp_path, make)
    with pytest.raises(EmitError, match=reason):
        write_if_changed(node, TEXT)
    assert check(os.lstat(node).st_mode) and not strays(tmp_path)


def test_a_symlink_to_a_device_is_refused_and_stays(tmp_path):
    node = _node(tmp_path, lambda p: os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3)))
    link = tmp_path / "out.cu"
    link.symlink_to(node)
    with pytest.raises(EmitError, match="character device"):
        write_if_changed(link, TEXT)
    assert link.is_symlink() and stat.S_ISCHR(os.lstat(node).st_mode) and not strays(tmp_path)


def test_a_directory_target_is_refused(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(EmitError, match=r"^cannot write .*out: it is a directory$"):
        write_if_changed(folder, TEXT)
    assert folder.is_dir() and not os.listdir(folder) and not strays(tmp_path)


def test_an_empty_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EmitError, match="^cannot write '': an empty path$"):
        write_if_changed("", TEXT)
    with pytest.raises(EmitError, match="^cannot write '': an empty path$"):
        emit("im2col", SPEC, "")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("path", [None, 3, b"k.cu"])
def test_emit_wants_a_file_path(path):
    with pytest.raises(TypeError, match=r"^emit's path must be a file path \(str or os.PathLike\); got "
                                        + type(path).__name__ + "$"):
        emit("im2col", SPEC, path)


@pytest.mark.parametrize("under", ["x.cu", "sub/x.cu"])
def test_a_path_under_a_regular_file_is_refused(tmp_path, under):
    blocker = tmp_path / "somefile.txt"
    blocker.write_text("keep")
    with pytest.raises(EmitError, match=r"somefile\.txt is a regular file, not a folder$"):
        write_if_changed(blocker / under, TEXT)
    assert blocker.read_text() == "keep" and not strays(tmp_path)


def test_an_unwritable_folder_is_one_line(tmp_path, monkeypatch):
    target = tmp_path / "k.cu"
    target.write_text("old")

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files_module.tempfile, "mkstemp", refuse)
    with pytest.raises(EmitError, match=rf"^cannot write .*k\.cu: the folder {tmp_path} is not writable "
                                        r"\(Permission denied\)$"):
        write_if_changed(target, TEXT)
    assert target.read_text() == "old" and not strays(tmp_path)


def test_an_unwritable_folder_above_missing_ones_is_named(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(files_module.Path, "mkdir", refuse)
    with pytest.raises(EmitError, match=rf"^cannot write .*k\.cu: the folder {tmp_path} is not writable "
                                        r"\(Permission denied\)$"):
        write_if_changed(tmp_path / "new" / "sub" / "k.cu", TEXT)
    assert not os.listdir(tmp_path)


@pytest.mark.skipif(ROOT or not hasattr(os, "geteuid"), reason="root writes into read-only folders")
def test_a_read_only_folder_for_real(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "k.cu").write_text("old")
    folder.chmod(0o555)
    try:
        with pytest.raises(EmitError, match=r"the folder .*ro is not writable \(Permission denied\)$"):
            write_if_changed(folder / "k.cu", TEXT)
        with pytest.raises(EmitError, match=r"the folder .*ro is not writable \(Permission denied\)$"):
            write_if_changed(folder / "new" / "k.cu", TEXT)
        assert (folder / "k.cu").read_text() == "old" and not strays(folder)
    finally:
        folder.chmod(0o755)


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "k.cu"
    target.write_text("old")
    real_write = os.write
    calls = []

    def fill_up(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files_module.os, "write", fill_up)
    with pytest.raises(EmitError, match=r"^cannot write .*k\.cu: No space left on device$") as caught:
        write_if_changed(target, TEXT)
    monkeypatch.undo()
    assert len(calls) == 2 and caught.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and not strays(tmp_path)


def test_a_failed_rename_removes_the_temporary(tmp_path, monkeypatch):
    target = tmp_path / "k.cu"

    def busy(src, dst):
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(files_module.os, "replace", busy)
    with pytest.raises(EmitError, match="Device or resource busy$"):
        write_if_changed(target, TEXT)
    assert not target.exists() and not strays(tmp_path)


def test_an_interrupt_removes_the_temporary_and_propagates(tmp_path, monkeypatch):
    target = tmp_path / "k.cu"
    target.write_text("old")

    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(files_module.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_if_changed(target, TEXT)
    assert target.read_text() == "old" and not strays(tmp_path)


def test_emit_error_is_an_oserror_with_one_line():
    error = EmitError("cannot write x: y")
    assert isinstance(error, OSError) and str(error) == "cannot write x: y"
