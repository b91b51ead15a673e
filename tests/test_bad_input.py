"""Bad input, table-driven (issue 35): every command and API entry point refuses it cleanly.

A refused CLI command exits 2 with one last stderr line ``convgen: error: ...`` (argparse's own
usage errors: ``convgen <cmd>: error: ...``, also exit 2) that names the offending field, shows no
traceback and leaves the file tree as it found it (no output file, no cache folder, no changed
file).  A refused Python call raises ``SpecError`` naming the field (``.field``), or ``TypeError``
with a sentence naming the parameter, never any other exception.

The CLI cases run in-process (``codegen.cli.main``) for speed, each in its own ``tmp_path`` as
cwd, with ``CONVGEN_CACHE_DIR`` and ``CONVGEN_TUNING_DB`` pointed inside it; a few run again as
real ``convgen`` processes to show that no traceback reaches a user.  CPU only: commands that need
a GPU are refused with a line saying so, which these tests accept where no GPU is visible.

Each CLI row is ``(id, argv, field, options)``: ``field`` is what the error line must name, as a
word (a tuple: any one of them); ``options`` may give ``files`` to create first (relative path ->
text, bytes, or ``DIR``) and ``readonly`` (a folder made read-only: chmod 0o555, and where the
tests run as root, who ignores permission bits, writes in it are refused by patched os/io calls).
Each Python row is ``(id, call(tmp_path), field, also, files)``.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import codegen
from codegen import cli
from codegen import compile as compile_module
from codegen.spec import ConvSpec, SpecError

CONVGEN = Path(sys.executable).with_name("convgen")
CASE_SECONDS = 45
"""A refusal is immediate; an in-process case running this long is reported as a hang."""
DIR = object()
"""In ``files``: make a folder."""
ERROR_LINE = re.compile(r"^convgen(?: [\w-]+)?: error: ")

GOOD = {"dims": 2, "layout": "NHWC", "n": 2, "c": 3, "k": 8, "input_size": [32, 32], "filter_size": [3, 3],
        "stride": 1, "padding": 1, "dilation": 1}


def spec_json(**changes) -> str:
    return json.dumps({**GOOD, **changes})


# ----------------------------------------------------------------------------------------------
# the environment: a private folder per case, snapshotted before and after
# ----------------------------------------------------------------------------------------------

@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """cwd, kernel cache and tuning database inside ``tmp_path``; returns ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    # a fresh process-wide kernel cache: a memory hit left by an earlier case would hide a compile
    monkeypatch.setattr(compile_module, "_CACHE", None)
    return tmp_path


def snapshot(root: Path) -> dict:
    """Every entry under ``root``: kind, size, mtime and mode of files; kind and mode of folders
    (a folder's mtime moves when a temporary comes and goes, which leaves nothing behind)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            info = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISDIR(info.st_mode):
                found[rel] = ("dir", stat.S_IMODE(info.st_mode))
            else:
                found[rel] = ("file", info.st_size, info.st_mtime_ns, stat.S_IMODE(info.st_mode))
    return found


def tree_changes(before: dict, after: dict) -> list[str]:
    """What a command left or changed in the tree, as sentences (empty: nothing)."""
    problems = []
    if "cache" in after and "cache" not in before:
        problems.append(f"created the cache folder ({sorted(k for k in after if k.startswith('cache'))})")
    added = sorted(k for k in set(after) - set(before) if k != "cache" and not k.startswith("cache/"))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    for what, names in (("left", added), ("removed", removed), ("changed", changed)):
        if names:
            problems.append(f"{what} {names}")
    return problems


def assert_unchanged(before: dict, after: dict) -> None:
    problems = tree_changes(before, after)
    assert not problems, "; ".join(problems)


def make_files(root: Path, files: dict) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIR:
            path.mkdir(exist_ok=True)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def _in_folder(path, folder: Path) -> bool:
    """Whether creating, replacing or removing ``path`` changes ``folder`` or a folder inside it."""
    if isinstance(path, int):  # a file descriptor: already open
        return False
    parent = Path(os.path.abspath(os.fspath(path))).parent
    return parent == folder or folder in parent.parents


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` read-only: chmod 0o555, and for root (whom permission bits do not stop) every
    os/io call that would create, replace or remove an entry in it raises PermissionError (EACCES),
    as the kernel would for anyone else."""
    folder = Path(os.path.abspath(folder))
    os.chmod(folder, 0o555)
    try:
        if os.geteuid() != 0:
            yield
            return

        def deny(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))

        def guard(original, *positions):
            def patched(*args, **kwargs):
                for i in positions:
                    if i < len(args) and _in_folder(args[i], folder):
                        if original is real_mkdir and os.path.lexists(args[i]):
                            raise FileExistsError(17, "File exists", os.fspath(args[i]))
                        deny(args[i])
                return original(*args, **kwargs)
            return patched

        real_os_open, real_io_open, real_access, real_mkdir = os.open, io.open, os.access, os.mkdir
        writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

        def os_open(path, flags, *args, **kwargs):
            if flags & writing and _in_folder(path, folder):
                deny(path)
            return real_os_open(path, flags, *args, **kwargs)

        def io_open(file, mode="r", *args, **kwargs):
            if any(ch in mode for ch in "wax+") and _in_folder(file, folder):
                deny(file)
            return real_io_open(file, mode, *args, **kwargs)

        def access(path, mode, *args, **kwargs):
            if mode & os.W_OK and not isinstance(path, int) and (
                    Path(os.path.abspath(path)) == folder or _in_folder(path, folder)):
                return False
            return real_access(path, mode, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "open", os_open)
            patch.setattr(io, "open", io_open)
            patch.setattr(builtins, "open", io_open)
            patch.setattr(os, "access", access)
            for name, positions in (("mkdir", (0,)), ("rmdir", (0,)), ("unlink", (0,)), ("remove", (0,)),
                                    ("replace", (0, 1)), ("rename", (0, 1)), ("symlink", (1,)), ("link", (1,))):
                patch.setattr(os, name, guard(getattr(os, name), *positions))
            yield
    finally:
        os.chmod(folder, 0o755)


@contextlib.contextmanager
def time_limit(seconds: int):
    """Turn a hang into a failure that says so (SIGALRM; the tests run in the main thread)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s: a refusal should be immediate")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ----------------------------------------------------------------------------------------------
# running the CLI and checking a refusal
# ----------------------------------------------------------------------------------------------

def run_in_process(argv: list[str], capsys) -> tuple[int, str, bool]:
    """(exit status, stderr, whether argparse exited); an exception escaping ``main`` is what a real
    user would see as a traceback and status 1, so it is reported that way."""
    capsys.readouterr()
    parser_exit = False
    try:
        with time_limit(CASE_SECONDS):
            code = cli.main(argv)
    except SystemExit as exit_:
        parser_exit = True
        code = exit_.code if isinstance(exit_.code, int) else 1
    except Exception as error:  # noqa: BLE001 - any escape is the bug under test
        code = 1
        print(f"Traceback (most recent call last):\n  (in-process)\n{type(error).__name__}: {error}", file=sys.stderr)
    return code, capsys.readouterr().err, parser_exit


def names(text: str, field) -> bool:
    """Whether ``text`` names ``field`` (or one of a tuple of them) as a word: 'n=' is not the tail of
    'pattern=', 'family' is not the tail of 'nofamily', 'ro' is not the head of 'root'."""
    for f in field if isinstance(field, tuple) else (field,):
        tail = r"(?!\w)" if f[-1:].isalnum() or f[-1:] == "_" else ""
        if re.search(r"(?<!\w)" + re.escape(f) + tail, text):
            return True
    return False


def refusal_problems(code: int, err: str, field, parser_exit: bool = False) -> list[str]:
    """How a command's exit falls short of a refusal naming ``field`` (empty: it is one)."""
    lines = [line for line in err.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    problems = []
    if "Traceback" in err:
        problems.append(f"a traceback reached the user, ending {last!r}")
    if code != 2:
        problems.append(f"exit {code}, not 2")
    if not ERROR_LINE.match(last):
        problems.append(f"the last stderr line is not 'convgen: error: ...': {last!r}")
    elif not parser_exit and len(lines) != 1:
        problems.append(f"a refusal is one line; stderr has {len(lines)}: {err[-600:]!r}")
    fields = field if isinstance(field, tuple) else (field,)
    if last and not names(last, field):
        problems.append(f"the last line does not name {' or '.join(map(repr, fields))}")
    return problems


def check_refusal(code: int, err: str, field, parser_exit: bool = False) -> None:
    problems = refusal_problems(code, err, field, parser_exit)
    assert not problems, "; ".join(problems)


# ----------------------------------------------------------------------------------------------
# the CLI table
# ----------------------------------------------------------------------------------------------

def case(id_: str, argv: str | list[str], field, **options):
    if isinstance(argv, str):
        argv = argv.split()
    return pytest.param(argv, field, options, id=id_)


NAME_INJECTION = 'a b; system("rm")'
BAD_UTF8 = b'{"dims": 2, "layout": "NHWC\xff\xfe", "n": 2}'
LAYER = {"name": "mine", "N": 2, "C": 8, "H": 16, "W": 16, "K": 8, "R": 3, "S": 3, "padding": 1}

CLI_CASES = [
    # --- generate: spec flags -------------------------------------------------------------------
    case("generate-n-huge", "generate im2col --n 99999999999999999999999", "n="),
    case("generate-n-zero", "generate im2col --n 0", "n="),
    case("generate-n-negative", "generate im2col --n -1", "n="),
    case("generate-n-not-int", "generate im2col --n abc", "--n"),
    case("generate-c-zero", "generate im2col --c 0", "c="),
    case("generate-c-huge", "generate im2col --c 4294967297", "c="),
    case("generate-k-zero", "generate direct --k 0", "k="),
    case("generate-dims-4", "generate im2col --dims 4", "--dims"),
    case("generate-dims-float", "generate im2col --dims 2.0", "--dims"),
    case("generate-layout-NCW", "generate im2col --layout NCW", "layout"),
    case("generate-layout-2d-with-dims-3", "generate im2col --layout NCHW --dims 3", "layout"),
    case("generate-layout-3d-with-dims-2", "generate im2col --layout NDHWC --dims 2", "layout"),
    case("generate-layout-empty", ["generate", "im2col", "--layout", ""], "layout"),
    case("generate-dpitch-below-c", "generate im2col --dpitch 2 --c 3", "dpitch"),
    case("generate-dpitch-channels-first", "generate im2col --layout NCHW --dpitch 4", "dpitch"),
    case("generate-dpitch-zero", "generate im2col --dpitch 0", "dpitch"),
    case("generate-filter-zero", "generate im2col --filter 0 3", "filter_size"),
    case("generate-filter-over-padded-input", "generate im2col --input 4 --filter 9 --padding 0", "filter_size"),
    case("generate-filter-three-entries-2d", "generate im2col --filter 3 3 3", "filter_size"),
    case("generate-dilation-over-padded-input", "generate im2col --input 32 --dilation 20", "filter_size"),
    case("generate-3d-with-2d-input", "generate im2col --dims 3 --input 8 8", "input_size"),
    case("generate-spec-flag-without-file", "generate im2col --spec", "--spec"),
    case("generate-stride-zero", "generate im2col --stride 0", "stride"),
    case("generate-stride-three-entries-2d", "generate im2col --stride 1 1 1", "stride"),
    case("generate-stride-huge", "generate im2col --stride 99999999999999999999", "stride"),
    case("generate-dilation-zero", "generate im2col --dilation 0", "dilation"),
    case("generate-padding-negative", "generate im2col --padding -1", "padding"),
    case("generate-padding-huge", "generate im2col --padding 99999999999999999999", "padding"),
    case("generate-input-3-entries-2d", "generate im2col --input 5 5 5", "input_size"),
    case("generate-input-zero", "generate im2col --input 0 5", "input_size"),
    case("generate-input-huge", "generate im2col --input 100000000000000000000", "input_size"),
    case("generate-input-not-int", "generate im2col --input 32.5 32", "--input"),
    case("generate-dtype-int8", "generate im2col --dtype int8", "dtype"),
    case("generate-col2im-scatter-float16", "generate col2im --dtype float16 --tile algorithm=scatter", "tiles.algorithm"),
    case("generate-dtype-float64", "generate im2col --dtype float64", "dtype"),
    case("generate-math-tf32-im2col", "generate im2col --math tf32", "math"),
    case("generate-math-bf16", "generate implicit_gemm --dtype bf16 --math tf32", "math"),
    case("generate-math-unknown", "generate implicit_gemm --math tf31", "math"),
    case("generate-direct-tma-bf16", "generate direct --layout NCHW --input 16 32 --dtype bf16 --tile variant=tiled_tma",
         "tiles.variant"),
    case("generate-im2win-bf16", "generate im2win --dtype bf16", "dtype"),
    case("compile-im2win-fp16", "compile im2win --dtype fp16", "dtype"),
    case("compile-im2col_gemm-3xtf32", "compile im2col_gemm --math 3xtf32", "math"),
    case("emit-col2im-tf32", "emit col2im --math tf32 -o k.cu", "math"),
    case("generate-bf16-warp_n-8", "generate implicit_gemm --dtype bf16 --tile warp_n=8", "tiles.warp_n"),
    case("generate-fp16-block_k-8", "generate implicit_gemm --dtype fp16 --tile block_k=8", "tiles.block_k"),
    case("generate-bf16-fma-tile", "generate implicit_gemm --dtype bf16 --tile thread_m=4", "tiles.thread_m"),
    case("generate-unknown-flag", "generate im2col --channels 3", "--channels"),
    case("generate-no-family", "generate", "family"),
    case("generate-unknown-family", "generate nofamily", "family="),
    case("generate-empty-family", ["generate", ""], "family="),
    # --- generate: tiles and workspace ----------------------------------------------------------
    case("generate-tile-no-equals", "generate im2col --tile foo", "--tile"),
    case("generate-tile-empty-name", "generate im2col --tile =5", "tiles."),
    case("generate-tile-unknown-name", "generate im2col --tile block_m=abc", "tiles.block_m"),
    case("generate-tile-not-int", "generate im2col --tile threads=abc", "tiles.threads"),
    case("generate-tile-not-multiple", "generate im2col --tile threads=33", "tiles.threads"),
    case("generate-tile-too-many-threads", "generate im2col --tile threads=2048", "tiles.threads"),
    case("generate-tile-bool-not-bool", "generate im2col --tile vectorized=maybe", "tiles.vectorized"),
    case("generate-tile-block_m-zero", "generate implicit_gemm --tile block_m=0", "tiles.block_m"),
    case("generate-tile-block_m-negative", "generate implicit_gemm --tile block_m=-3", "tiles.block_m"),
    case("generate-tile-tma-maybe", "generate implicit_gemm --tile tma=maybe", "tiles.tma"),
    case("generate-tile-tma-unaligned-pitch", "generate implicit_gemm --tile tma=true", "dpitch"),
    case("generate-tile-algorithm", "generate col2im --tile algorithm=fast", "tiles.algorithm"),
    case("generate-tile-variant", "generate direct --tile variant=nope", "tiles.variant"),
    case("generate-tile-batch-chunk-not-divisor", "generate im2win --tile batch_chunk=3", "batch_chunk"),
    case("generate-workspace-10MB", "generate im2win --workspace-limit 10MB", "--workspace-limit"),
    case("generate-workspace-negative", "generate im2win --workspace-limit -1", "--workspace-limit"),
    case("generate-workspace-abc", "generate im2win --workspace-limit abc", "--workspace-limit"),
    case("generate-workspace-inf", "generate im2win --workspace-limit 1e999", "--workspace-limit"),
    case("generate-workspace-nan", "generate im2win --workspace-limit nan", "--workspace-limit"),
    case("generate-workspace-fraction-of-byte", "generate im2win --workspace-limit 1.5", "--workspace-limit"),
    case("generate-workspace-under-tiles", "generate im2win --workspace-limit 1 --tile batch_chunk=2",
         "workspace_limit"),
    # --- --spec FILE.json -----------------------------------------------------------------------
    case("spec-file-n-huge", "generate im2col --spec s.json", "n=",
         files={"s.json": '{"dims": 2, "layout": "NHWC", "n": 99999999999999999999999, "c": 3, "k": 8, '
                          '"input_size": [32, 32], "filter_size": [3, 3]}'}),
    case("spec-file-dims-float", "generate im2col --spec s.json", "dims", files={"s.json": spec_json(dims=2.0)}),
    case("spec-file-dims-string", "generate im2col --spec s.json", "dims", files={"s.json": spec_json(dims="2")}),
    case("spec-file-dims-inf", "generate im2col --spec s.json", "dims",
         files={"s.json": spec_json().replace('"dims": 2', '"dims": 1e400')}),
    case("spec-file-invalid-utf8", "generate im2col --spec s.json", "spec", files={"s.json": BAD_UTF8}),
    case("spec-file-list", "generate im2col --spec s.json", "spec", files={"s.json": "[]"}),
    case("spec-file-null", "generate im2col --spec s.json", "spec", files={"s.json": "null"}),
    case("spec-file-empty", "generate im2col --spec s.json", "spec", files={"s.json": ""}),
    case("spec-file-truncated", "generate im2col --spec s.json", "spec", files={"s.json": '{"dims": 2,'}),
    case("spec-file-missing", "generate im2col --spec missing.json", "spec"),
    case("spec-file-directory", "generate im2col --spec folder", "spec", files={"folder": DIR}),
    case("spec-file-unknown-field", "generate im2col --spec s.json", "bogus",
         files={"s.json": spec_json(bogus=1)}),
    case("spec-file-padding-negative", "generate im2col --spec s.json", "padding",
         files={"s.json": spec_json(padding=-1)}),
    case("spec-file-stride-one-entry-2d", "generate im2col --spec s.json", "stride",
         files={"s.json": spec_json(stride=[1])}),
    case("spec-file-input-zero", "generate im2col --spec s.json", "input_size",
         files={"s.json": spec_json(input_size=[0, 5])}),
    case("spec-file-dtype-float64", "generate im2col --spec s.json", "dtype",
         files={"s.json": spec_json(dtype="float64")}),
    case("spec-file-nested-garbage", "generate im2col --spec s.json", "input_size",
         files={"s.json": spec_json(input_size={"h": [1, {"x": None}], "w": "wide"})}),
    case("spec-file-n-true", "generate im2col --spec s.json", "n=", files={"s.json": spec_json(n=True)}),
    case("spec-file-n-nan", "generate im2col --spec s.json", "n=",
         files={"s.json": spec_json().replace('"n": 2', '"n": NaN')}),
    case("spec-file-layout-number", "generate im2col --spec s.json", "layout", files={"s.json": spec_json(layout=4)}),
    case("spec-file-layout-list", "generate im2col --spec s.json", "layout",
         files={"s.json": spec_json(layout=["NHWC"])}),
    case("spec-file-3d-with-2d-layout", "generate im2col --spec s.json", "layout",
         files={"s.json": spec_json(dims=3, input_size=[8, 8, 8], filter_size=[3, 3, 3])}),
    case("spec-file-dpitch-float", "generate im2col --spec s.json", "dpitch", files={"s.json": spec_json(dpitch=4.0)}),
    case("emit-spec-file-bad-no-output", "emit im2col --spec s.json -o k.cu", "padding",
         files={"s.json": spec_json(padding=-1)}),
    case("compile-spec-file-invalid-utf8", "compile im2col --spec s.json", "spec", files={"s.json": BAD_UTF8}),
    # --- emit -----------------------------------------------------------------------------------
    case("emit-name-injection", ["emit", "im2col", "-o", "k.cu", "--name", NAME_INJECTION], ("--name", "launcher")),
    case("emit-name-keyword-int", "emit im2col -o k.cu --name int", ("--name", "launcher")),
    case("emit-name-leading-digit", "emit im2col -o k.cu --name 1abc", ("--name", "launcher")),
    case("emit-name-empty", ["emit", "im2col", "-o", "k.cu", "--name", ""], ("--name", "launcher")),
    case("emit-name-keyword-class", "emit im2col -o k.cu --name class", ("--name", "launcher")),
    case("emit-name-dash", "emit im2col -o k.cu --name my-launcher", ("--name", "launcher")),
    case("emit-arch-sm_75-implicit_gemm-cp.async", "emit implicit_gemm --tile async_copy=true --arch sm_75 -o k.cu",
         "arch"),
    case("emit-arch-sm_75-implicit_gemm-tma", "emit implicit_gemm --tile tma=true --dpitch 4 --arch sm_75 -o k.cu",
         "arch"),
    case("emit-arch-sm_80-implicit_gemm-tma", "emit implicit_gemm --tile tma=true --dpitch 4 --arch sm_80 -o k.cu",
         "arch"),
    case("emit-arch-sm_999", "emit im2col --arch sm_999 -o k.cu", "arch"),
    case("emit-arch-90", "emit im2col --arch 90 -o k.cu", "arch"),
    case("emit-arch-sm90", "emit im2col --arch sm90 -o k.cu", "arch"),
    case("emit-arch-empty", ["emit", "im2col", "--arch", "", "-o", "k.cu"], "arch"),
    case("emit-output-directory", "emit im2col -o .", ("output", "'.'", "directory")),
    case("emit-output-existing-folder", "emit im2col -o folder", ("output", "folder"), files={"folder": DIR}),
    case("emit-output-empty", ["emit", "im2col", "-o", ""], ("output", "empty")),
    case("emit-output-under-regular-file", "emit im2col -o plain.txt/k.cu", ("output", "plain.txt"),
         files={"plain.txt": "not a folder\n"}),
    case("emit-output-read-only-folder", "emit im2col -o ro/k.cu", ("output", "ro/k.cu"), files={"ro": DIR},
         readonly="ro"),
    case("emit-output-missing", "emit im2col", ("-o", "--output")),
    case("emit-output-char-device", "emit im2col -o /dev/null", ("output", "/dev/null")),
    case("emit-name-without-value", "emit im2col -o k.cu --name", "--name"),
    case("emit-cublas-family", "emit im2col_gemm -o k.cu", "family="),
    case("emit-bad-spec-keeps-existing-file", "emit im2col --c 0 -o k.cu", "c=",
         files={"k.cu": "// a file the user had\n"}),
    case("emit-bad-tile", "emit im2col --tile threads=7 -o k.cu", "tiles.threads"),
    case("emit-workspace-10MB", "emit im2win --workspace-limit 10MB -o k.cu", "--workspace-limit"),
    # --- compile --------------------------------------------------------------------------------
    case("compile-arch-sm_75-implicit_gemm-cp.async", "compile implicit_gemm --tile async_copy=true --arch sm_75",
         "arch"),
    case("compile-arch-sm_80-implicit_gemm-tma", "compile implicit_gemm --tile tma=true --dpitch 4 --arch sm_80",
         "arch"),
    case("compile-arch-sm_999", "compile im2col --arch sm_999", "arch"),
    case("compile-arch-hopper", "compile im2col --arch hopper", "arch"),
    case("compile-arch-empty", ["compile", "im2col", "--arch", ""], "arch"),
    case("compile-n-zero", "compile im2col --n 0", "n="),
    case("compile-n-huge", "compile im2col --n 99999999999999999999999", "n="),
    case("compile-bad-tile", "compile im2col --tile threads=2048", "tiles.threads"),
    case("compile-workspace-10MB", "compile im2win --workspace-limit 10MB", "--workspace-limit"),
    case("compile-unknown-family", "compile nofamily", "family="),
    # --- run (GPU) ------------------------------------------------------------------------------
    case("run-no-gpu", "run im2col", "GPU"),
    case("run-no-family", "run", "family"),
    case("run-unknown-family", "run nofamily", ("family=", "GPU")),
    case("run-bad-spec", "run im2col --c 0", ("c=", "GPU")),
    case("run-bad-tile", "run im2col --tile foo", ("--tile", "GPU")),
    case("run-arch-flag", "run im2col --arch sm_90", "--arch"),
    case("run-im2win-bf16", "run im2win --dtype bf16", "dtype"),
    case("run-im2col-tf32", "run im2col --math tf32", "math"),
    # --- fuzz -----------------------------------------------------------------------------------
    case("fuzz-examples-0", "fuzz im2col --examples 0", "--examples"),
    case("fuzz-examples-negative", "fuzz col2im --examples -5", "--examples"),
    case("fuzz-examples-not-int", "fuzz im2col --examples abc", "--examples"),
    case("fuzz-seed-not-int", "fuzz im2col --seed abc", "--seed"),
    case("fuzz-unknown-family", "fuzz nofamily --examples 5", "family="),
    case("fuzz-spec-file", "fuzz im2col --spec s.json", "--spec", files={"s.json": spec_json()}),
    case("fuzz-pin-c-zero", "fuzz im2col --c 0", "c="),
    case("fuzz-pin-n-huge", "fuzz im2col --n 99999999999999999999999", "n="),
    case("fuzz-pin-layout-NCW", "fuzz im2col --layout NCW", "layout"),
    case("fuzz-pin-layout-against-dims", "fuzz im2col --dims 3 --layout NHWC", "layout"),
    case("fuzz-pin-dtype", "fuzz im2win --dtype float16", "dtype"),
    case("fuzz-pin-math-im2col", "fuzz im2col --math tf32", "math"),
    case("fuzz-pin-math-direct", "fuzz direct --math 3xtf32", "math"),
    case("fuzz-bf16-tma-tile", "fuzz implicit_gemm --dtype bf16 --tile tma=true", "tiles.tma"),
    case("fuzz-bf16-tile-bad-value", "fuzz implicit_gemm --dtype bf16 --tile block_k=48", "tiles.block_k"),
    case("fuzz-pin-stride-three-entries-2d", "fuzz im2col --dims 2 --stride 1 1 1", "stride"),
    case("fuzz-tile-no-equals", "fuzz im2col --tile foo", "--tile"),
    case("fuzz-tile-unknown", "fuzz im2col --tile bogus=1 --examples 5", "tiles.bogus"),
    case("fuzz-tile-bad-value", "fuzz im2col --tile threads=33 --examples 5", "tiles.threads"),
    case("fuzz-workspace-flag", "fuzz im2win --workspace-limit 1MiB", "--workspace-limit"),
    # --- bench (GPU) ----------------------------------------------------------------------------
    case("bench-conv-layers-nope", "bench conv --layers nope", "--layers"),
    case("bench-conv-dtype-unknown", "bench conv --dtype bf17", "dtype"),
    case("bench-im2col-dtype-unknown", "bench im2col --dtype bf17", "dtype"),
    case("bench-col2im-math", "bench col2im --math tf32", "--math"),
    case("bench-conv-families-without-tensor-cores", "bench conv --families im2win --dtype bf16", "--families"),
    case("bench-conv-math-on-bf16", "bench conv --dtype bf16 --math tf32", "math"),
    case("bench-conv-shapes-missing", "bench conv --shapes missing.json", "--shapes"),
    case("bench-im2col-shapes", "bench im2col --shapes x.json", "--shapes", files={"x.json": "[]"}),
    case("bench-im2col-families", "bench im2col --families implicit_gemm", "--families"),
    case("bench-conv-shapes-invalid-json", "bench conv --shapes bad.json", "--shapes", files={"bad.json": "{layers: ["}),
    case("bench-conv-shapes-invalid-utf8", "bench conv --shapes bad.json", "--shapes", files={"bad.json": BAD_UTF8}),
    case("bench-conv-shapes-no-layers", "bench conv --shapes s.json", "--shapes",
         files={"s.json": json.dumps({"layers": []})}),
    case("bench-conv-shapes-layer-missing-K", "bench conv --shapes s.json", "K",
         files={"s.json": json.dumps({"layers": [{k: v for k, v in LAYER.items() if k != "K"}]})}),
    case("bench-conv-shapes-layer-C-zero", "bench conv --shapes s.json", "C",
         files={"s.json": json.dumps({"layers": [{**LAYER, "C": 0}]})}),
    case("bench-conv-shapes-layer-stride-zero", "bench conv --shapes s.json", "stride",
         files={"s.json": json.dumps({"layers": [{**LAYER, "stride": 0}]})}),
    case("bench-conv-shapes-duplicate-name", "bench conv --shapes s.json", "name",
         files={"s.json": json.dumps({"layers": [LAYER, LAYER]})}),
    case("bench-conv-shapes-directory", "bench conv --shapes folder", "--shapes", files={"folder": DIR}),
    case("bench-unknown-family", "bench implicit_gemm", "family"),
    case("bench-conv-families-nope", "bench conv --families nope", "--families"),
    case("bench-repeats-not-int", "bench conv --repeats many", "--repeats"),
    case("bench-conv-repeats-zero", "bench conv --repeats 0", ("--repeats", "GPU")),
    case("bench-direct-layers-nope", "bench direct --layers nope", ("--layers", "GPU")),
    case("bench-conv-layouts-NCW", "bench conv --layouts NCW", ("layout", "GPU")),
    case("bench-im2col-no-gpu", "bench im2col", "GPU"),
    # --- tune -----------------------------------------------------------------------------------
    case("tune-no-family", "tune", "FAMILY"),
    case("tune-layer-without-family", "tune --layer nope", ("FAMILY", "--layer")),
    case("tune-layer-nope", "tune im2win --layer nope", "--layer"),
    case("tune-layer-with-bad-layout", "tune im2win --layer conv4 --layout NCW", "layout"),
    case("tune-unknown-family", "tune nofamily", ("family=", "GPU")),
    case("tune-with-tile", "tune im2win --tile threads=64", "--tile"),
    case("tune-shapes-without-layer", "tune im2win --shapes s.json", "--shapes",
         files={"s.json": json.dumps({"layers": [LAYER]})}),
    case("tune-layer-and-spec", "tune im2win --layer conv4 --spec s.json", ("--spec", "--layer"),
         files={"s.json": spec_json()}),
    case("tune-bad-spec", "tune im2win --c 0", "c="),
    case("tune-im2win-bf16", "tune im2win --dtype bf16", "dtype"),
    case("tune-im2win-tf32", "tune im2win --layer conv4 --math tf32", "math"),
    case("tune-workspace-10MB", "tune im2win --workspace-limit 10MB", "--workspace-limit"),
    case("tune-budget-not-number", "tune im2win --budget soon", "--budget"),
    case("tune-budget-negative", "tune im2win --budget -1", ("--budget", "GPU")),
    case("tune-max-configs-zero", "tune im2win --max-configs 0", ("--max-configs", "GPU")),
    case("tune-import-missing", "tune --import missing.json", "--import"),
    case("tune-import-invalid-json", "tune --import bad.json", "--import", files={"bad.json": "{entries: "}),
    case("tune-import-list", "tune --import bad.json", "--import", files={"bad.json": "[]"}),
    case("tune-import-invalid-utf8", "tune --import bad.json", "--import", files={"bad.json": BAD_UTF8}),
    case("tune-import-directory", "tune --import folder", "--import", files={"folder": DIR}),
    case("tune-import-entry-without-tiles", "tune --import bad.json", "--import",
         files={"bad.json": json.dumps({"format": 1, "entries": {"x": {"family": "im2win"}}})}),
    case("tune-export-directory", "tune --export folder", ("--export", "folder"), files={"folder": DIR}),
    case("tune-export-under-regular-file", "tune --export plain.txt/t.json", ("--export", "plain.txt"),
         files={"plain.txt": "not a folder\n"}),
    case("tune-db-is-directory", "tune --show --db folder", ("--db", "folder"),
         files={"folder": DIR, "folder/keep.txt": "mine\n"}),
    # --- cache, families, catalogue, demo, no command ------------------------------------------
    case("cache-no-action", "cache", "action"),
    case("cache-unknown-action", "cache purge", "action"),
    case("cache-extra-argument", "cache info extra", "extra"),
    case("cache-unknown-flag", "cache clear --all", "--all"),
    case("families-extra-argument", "families extra-arg", "extra-arg"),
    case("families-unknown-flag", "families --tile x", "--tile"),
    case("catalogue-unknown-flag", "catalogue --bogus", "--bogus"),
    case("catalogue-extra-argument", "catalogue extra", "extra"),
    case("catalogue-check-with-value", "catalogue --check=yes", "--check"),
    case("demo-out-under-regular-file", "demo --out plain.txt/demo", ("--out", "plain.txt"),
         files={"plain.txt": "not a folder\n"}),
    case("demo-out-regular-file", "demo --out plain.txt", ("--out", "plain.txt"), files={"plain.txt": "a file\n"}),
    case("demo-out-read-only-folder", "demo --out ro/demo", ("--out", "ro/demo"), files={"ro": DIR}, readonly="ro"),
    case("demo-unknown-flag", "demo --bogus", "--bogus"),
    case("no-command", [], "COMMAND"),
    case("unknown-command", "frobnicate", "frobnicate"),
]


@pytest.mark.parametrize("argv, field, options", CLI_CASES)
def test_cli_refuses_bad_input(argv, field, options, sandbox, capsys):
    make_files(sandbox, options.get("files", {}))
    with contextlib.ExitStack() as stack:
        if "readonly" in options:
            stack.enter_context(read_only(sandbox / options["readonly"]))
        before = snapshot(sandbox)
        code, err, parser_exit = run_in_process(argv, capsys)
        after = snapshot(sandbox)
    problems = refusal_problems(code, err, field, parser_exit) + tree_changes(before, after)
    assert not problems, "; ".join(problems)


SUBPROCESS_IDS = ("generate-n-huge", "spec-file-invalid-utf8", "emit-name-injection", "emit-output-directory",
                  "fuzz-examples-0", "tune-export-directory")


@pytest.mark.parametrize("argv, field, options", [c for c in CLI_CASES if c.id in SUBPROCESS_IDS])
def test_cli_refusal_as_a_real_process(argv, field, options, tmp_path):
    """The same refusals from the installed ``convgen`` script: what a user's shell sees."""
    make_files(tmp_path, options.get("files", {}))
    env = {**os.environ, "CONVGEN_CACHE_DIR": str(tmp_path / "cache"),
           "CONVGEN_TUNING_DB": str(tmp_path / "tuning.json")}
    before = snapshot(tmp_path)
    result = subprocess.run([str(CONVGEN), *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    after = snapshot(tmp_path)
    parser_exit = "usage:" in result.stderr
    problems = refusal_problems(result.returncode, result.stderr, field, parser_exit) + tree_changes(before, after)
    assert not problems, "; ".join(problems)


# ----------------------------------------------------------------------------------------------
# the Python API table
# ----------------------------------------------------------------------------------------------

SPEC = ConvSpec(**GOOD)
SPEC_PITCH4 = ConvSpec(**{**GOOD, "dpitch": 4})


def spec(**changes) -> ConvSpec:
    return ConvSpec(**{**GOOD, **changes})


def spec_dict(**changes) -> dict:
    return {**GOOD, **changes}


def from_json_file(tmp: Path) -> ConvSpec:
    return ConvSpec.from_json(str(tmp / "s.json"))


def emit_to(tmp: Path, **kwargs):
    from codegen.emit import emit

    args = {"family": "im2col", "spec": SPEC, "path": tmp / "k.cu", **kwargs}
    return emit(**args)


def emit_source(**kwargs):
    from codegen.emit import emit_source as source

    return source(**{"family": "im2col", "spec": SPEC, **kwargs})


def api(id_: str, call, field, also: tuple = (), files: dict | None = None):
    """``call(tmp_path)`` must raise SpecError naming ``field`` or a TypeError sentence naming it;
    ``also``: other exception types this entry point may document (emit's EmitError, an OSError);
    ``files``: made in ``tmp_path`` first, as for the CLI."""
    return pytest.param(call, field, also, files or {}, id=id_)


API_CASES = [
    # --- ConvSpec -------------------------------------------------------------------------------
    api("ConvSpec-dims-float", lambda t: spec(dims=2.0), "dims"),
    api("ConvSpec-dims-numpy-float", lambda t: spec(dims=np.float64(2.0)), "dims"),
    api("ConvSpec-dims-string", lambda t: spec(dims="2"), "dims"),
    api("ConvSpec-dims-bool", lambda t: spec(dims=True), "dims"),
    api("ConvSpec-dims-none", lambda t: spec(dims=None), "dims"),
    api("ConvSpec-dims-4", lambda t: spec(dims=4), "dims"),
    api("ConvSpec-layout-NCW", lambda t: spec(layout="NCW"), "layout"),
    api("ConvSpec-layout-none", lambda t: spec(layout=None), "layout"),
    api("ConvSpec-layout-list", lambda t: spec(layout=["NHWC"]), "layout"),
    api("ConvSpec-layout-3d-in-2d", lambda t: spec(layout="NDHWC"), "layout"),
    api("ConvSpec-n-1e30", lambda t: spec(n=10**30), "n"),
    api("ConvSpec-n-zero", lambda t: spec(n=0), "n"),
    api("ConvSpec-n-negative", lambda t: spec(n=-1), "n"),
    api("ConvSpec-n-float", lambda t: spec(n=2.0), "n"),
    api("ConvSpec-n-numpy-float", lambda t: spec(n=np.float64(2.0)), "n"),
    api("ConvSpec-n-string", lambda t: spec(n="2"), "n"),
    api("ConvSpec-n-bool", lambda t: spec(n=True), "n"),
    api("ConvSpec-n-numpy-bool", lambda t: spec(n=np.bool_(True)), "n"),
    api("ConvSpec-c-zero", lambda t: spec(c=0), "c"),
    api("ConvSpec-c-2**31", lambda t: spec(c=2**31), "c"),
    api("ConvSpec-k-float", lambda t: spec(k=1.5), "k"),
    api("ConvSpec-k-1e20", lambda t: spec(k=10**20), "k"),
    api("ConvSpec-input-zero", lambda t: spec(input_size=(0, 5)), "input_size"),
    api("ConvSpec-input-3-entries-2d", lambda t: spec(input_size=(5, 5, 5)), "input_size"),
    api("ConvSpec-input-empty", lambda t: spec(input_size=()), "input_size"),
    api("ConvSpec-input-string", lambda t: spec(input_size="32"), "input_size"),
    api("ConvSpec-input-float-entry", lambda t: spec(input_size=[32.0, 32]), "input_size"),
    api("ConvSpec-input-none", lambda t: spec(input_size=None), "input_size"),
    api("ConvSpec-input-1e30", lambda t: spec(input_size=(10**30, 10**30)), "input_size"),
    api("ConvSpec-filter-zero", lambda t: spec(filter_size=(0, 3)), "filter_size"),
    api("ConvSpec-filter-over-padded-input", lambda t: spec(input_size=4, filter_size=9, padding=0), "filter_size"),
    api("ConvSpec-stride-zero", lambda t: spec(stride=0), "stride"),
    api("ConvSpec-stride-one-entry-2d", lambda t: spec(stride=(1,)), "stride"),
    api("ConvSpec-stride-float-entry", lambda t: spec(stride=(1, 1.5)), "stride"),
    api("ConvSpec-padding-negative", lambda t: spec(padding=-1), "padding"),
    api("ConvSpec-padding-negative-entry", lambda t: spec(padding=(1, -1)), "padding"),
    api("ConvSpec-padding-inf", lambda t: spec(padding=float("inf")), "padding"),
    api("ConvSpec-dilation-zero", lambda t: spec(dilation=0), "dilation"),
    api("ConvSpec-dpitch-below-c", lambda t: spec(dpitch=2), "dpitch"),
    api("ConvSpec-dpitch-channels-first", lambda t: spec(layout="NCHW", dpitch=4), "dpitch"),
    api("ConvSpec-dpitch-float", lambda t: spec(dpitch=4.0), "dpitch"),
    api("ConvSpec-dpitch-zero", lambda t: spec(dpitch=0), "dpitch"),
    api("ConvSpec-dtype-float64", lambda t: spec(dtype="float64"), "dtype"),
    api("ConvSpec-math-on-float16", lambda t: spec(dtype="float16", math="tf32"), "math"),
    api("ConvSpec-math-unknown", lambda t: spec(math="fp64"), "math"),
    api("ConvSpec-dtype-none", lambda t: spec(dtype=None), "dtype"),
    api("ConvSpec-unknown-keyword", lambda t: spec(bogus=1), "bogus"),
    api("ConvSpec-missing-fields", lambda t: ConvSpec(dims=2), "layout"),
    # --- ConvSpec.from_dict ---------------------------------------------------------------------
    api("from_dict-list", lambda t: ConvSpec.from_dict([]), ("spec", "data")),
    api("from_dict-none", lambda t: ConvSpec.from_dict(None), ("spec", "data")),
    api("from_dict-string", lambda t: ConvSpec.from_dict("dims=2"), ("spec", "data")),
    api("from_dict-unknown-field", lambda t: ConvSpec.from_dict(spec_dict(bogus=1)), "bogus"),
    api("from_dict-missing-layout", lambda t: ConvSpec.from_dict({"dims": 2}), "layout"),
    api("from_dict-n-1e30", lambda t: ConvSpec.from_dict(spec_dict(n=10**30)), "n"),
    api("from_dict-dims-float", lambda t: ConvSpec.from_dict(spec_dict(dims=2.0)), "dims"),
    api("from_dict-dpitch-string", lambda t: ConvSpec.from_dict(spec_dict(dpitch="4")), "dpitch"),
    api("from_dict-nested-garbage", lambda t: ConvSpec.from_dict(spec_dict(input_size={"h": [1, {}]})), "input_size"),
    api("from_dict-mixed-key-types", lambda t: ConvSpec.from_dict({**spec_dict(), 1: 2, "x": 3}), ("1", "x")),
    # --- ConvSpec.from_json ---------------------------------------------------------------------
    api("from_json-missing", lambda t: ConvSpec.from_json(str(t / "missing.json")), "spec"),
    api("from_json-directory", lambda t: ConvSpec.from_json(str(t)), "spec"),
    api("from_json-invalid-utf8", from_json_file, "spec", files={"s.json": BAD_UTF8}),
    api("from_json-list", from_json_file, "spec", files={"s.json": "[]"}),
    api("from_json-null", from_json_file, "spec", files={"s.json": "null"}),
    api("from_json-empty", from_json_file, "spec", files={"s.json": ""}),
    api("from_json-truncated", from_json_file, "spec", files={"s.json": '{"dims": 2,'}),
    api("from_json-dims-float", from_json_file, "dims", files={"s.json": spec_json(dims=2.0)}),
    api("from_json-n-huge", from_json_file, "n", files={"s.json": spec_json(n=99999999999999999999999)}),
    api("from_json-stride-one-entry-2d", from_json_file, "stride", files={"s.json": spec_json(stride=[1])}),
    api("from_json-path-none", lambda t: ConvSpec.from_json(None), ("spec", "path")),
    # --- plan -----------------------------------------------------------------------------------
    api("plan-unknown-family", lambda t: codegen.plan("nope", SPEC), "family"),
    api("plan-family-none", lambda t: codegen.plan(None, SPEC), "family"),
    api("plan-spec-dict", lambda t: codegen.plan("im2col", spec_dict()), "spec"),
    api("plan-spec-none", lambda t: codegen.plan("im2col", None), "spec"),
    api("plan-tiles-block_m-zero", lambda t: codegen.plan("implicit_gemm", SPEC, tiles={"block_m": 0}), "tiles.block_m"),
    api("plan-tiles-unknown-for-family", lambda t: codegen.plan("im2col", SPEC, tiles={"block_m": 0}), "tiles.block_m"),
    api("plan-tiles-int", lambda t: codegen.plan("im2col", SPEC, tiles=5), "tiles"),
    api("plan-tiles-string", lambda t: codegen.plan("im2col", SPEC, tiles="threads=64"), "tiles"),
    api("plan-tiles-list", lambda t: codegen.plan("im2col", SPEC, tiles=[("threads", 64)]), "tiles"),
    api("plan-tiles-value-string", lambda t: codegen.plan("im2col", SPEC, tiles={"threads": "64"}), "tiles.threads"),
    api("plan-tiles-value-float", lambda t: codegen.plan("im2col", SPEC, tiles={"threads": 64.0}), "tiles.threads"),
    api("plan-tiles-other-family", lambda t: codegen.plan(
        "im2col", SPEC, tiles=codegen.plan("implicit_gemm", SPEC).tiles), "tiles"),
    api("plan-tiles-algorithm", lambda t: codegen.plan("col2im", SPEC, {"algorithm": "fast"}), "tiles.algorithm"),
    api("plan-tma-unaligned-pitch", lambda t: codegen.plan("implicit_gemm", SPEC, {"tma": True}), "dpitch"),
    api("plan-workspace-negative", lambda t: codegen.plan("im2win", SPEC, workspace_limit=-1), "workspace_limit"),
    api("plan-workspace-float", lambda t: codegen.plan("im2win", SPEC, workspace_limit=1.5), "workspace_limit"),
    api("plan-workspace-string", lambda t: codegen.plan("im2win", SPEC, workspace_limit="64MiB"), "workspace_limit"),
    api("plan-workspace-bool", lambda t: codegen.plan("im2win", SPEC, workspace_limit=True), "workspace_limit"),
    api("plan-arch-int", lambda t: codegen.plan("im2col", SPEC, arch=90), "arch"),
    api("plan-arch-sm90", lambda t: codegen.plan("im2col", SPEC, arch="sm90"), "arch"),
    api("plan-arch-sm_999", lambda t: codegen.plan("im2col", SPEC, arch="sm_999"), "arch"),
    # --- build ----------------------------------------------------------------------------------
    api("build-unknown-family", lambda t: codegen.build("nope", SPEC), "family"),
    api("build-spec-dict", lambda t: codegen.build("im2col", spec_dict()), "spec"),
    api("build-arch-int", lambda t: codegen.build("im2col", SPEC, arch=90), "arch"),
    api("build-arch-empty", lambda t: codegen.build("im2col", SPEC, arch=""), "arch"),
    api("build-arch-sm_999", lambda t: codegen.build("im2col", SPEC, arch="sm_999"), "arch"),
    api("build-arch-sm_75-tma", lambda t: codegen.build("implicit_gemm", SPEC_PITCH4, {"tma": True}, arch="sm_75"),
        "arch"),
    api("build-arch-sm_75-implicit_gemm-cp.async",
        lambda t: codegen.build("implicit_gemm", SPEC, {"async_copy": True}, arch="sm_75"), "arch"),
    api("build-tiles-int", lambda t: codegen.build("im2col", SPEC, tiles=5), "tiles"),
    api("build-workspace-negative", lambda t: codegen.build("im2win", SPEC, workspace_limit=-1), "workspace_limit"),
    api("build-workspace-float", lambda t: codegen.build("im2win", SPEC, workspace_limit=1.5), "workspace_limit"),
    api("build-workspace-string", lambda t: codegen.build("im2win", SPEC, workspace_limit="64MiB"),
        "workspace_limit"),
    # --- emit -----------------------------------------------------------------------------------
    api("emit-path-none", lambda t: emit_to(t, path=None), "path"),
    api("emit-path-int", lambda t: emit_to(t, path=5), "path"),
    api("emit-path-directory", lambda t: emit_to(t, path=t), "path", also=(OSError,)),
    api("emit-launcher-injection", lambda t: emit_to(t, launcher=NAME_INJECTION), "launcher"),
    api("emit-launcher-keyword-int", lambda t: emit_to(t, launcher="int"), "launcher"),
    api("emit-launcher-leading-digit", lambda t: emit_to(t, launcher="1abc"), "launcher"),
    api("emit-launcher-empty", lambda t: emit_to(t, launcher=""), "launcher"),
    api("emit-launcher-keyword-class", lambda t: emit_to(t, launcher="class"), "launcher"),
    api("emit-launcher-int", lambda t: emit_to(t, launcher=5), "launcher"),
    api("emit-arch-int", lambda t: emit_to(t, arch=90), "arch"),
    api("emit-arch-sm_75-implicit_gemm-cp.async",
        lambda t: emit_to(t, family="implicit_gemm", tiles={"async_copy": True}, arch="sm_75"), "arch"),
    api("emit-arch-sm_999", lambda t: emit_to(t, arch="sm_999"), "arch"),
    api("emit-cublas-family", lambda t: emit_to(t, family="im2col_gemm"), "family"),
    api("emit-spec-dict", lambda t: emit_to(t, spec=spec_dict()), "spec"),
    api("emit-tiles-int", lambda t: emit_to(t, tiles=5), "tiles"),
    api("emit-workspace-string", lambda t: emit_to(t, family="im2win", workspace_limit="64MiB"), "workspace_limit"),
    # --- emit_source ----------------------------------------------------------------------------
    api("emit_source-launcher-space", lambda t: emit_source(launcher="a b"), "launcher"),
    api("emit_source-launcher-keyword", lambda t: emit_source(launcher="int"), "launcher"),
    api("emit_source-launcher-empty", lambda t: emit_source(launcher=""), "launcher"),
    api("emit_source-arch-sm_999", lambda t: emit_source(arch="sm_999"), "arch"),
    api("emit_source-arch-int", lambda t: emit_source(arch=90), "arch"),
    api("emit_source-arch-sm_75-implicit_gemm-cp.async",
        lambda t: emit_source(family="implicit_gemm", tiles={"async_copy": True}, arch="sm_75"), "arch"),
    api("emit_source-spec-dict", lambda t: emit_source(spec=spec_dict()), "spec"),
    api("emit_source-unknown-family", lambda t: emit_source(family="nope"), "family"),
    api("emit_source-tiles-int", lambda t: emit_source(tiles=5), "tiles"),
]


@pytest.mark.parametrize("call, field, also, files", API_CASES)
def test_api_refuses_bad_input(call, field, also, files, sandbox):
    fields = field if isinstance(field, tuple) else (field,)
    named = " or ".join(map(repr, fields))
    make_files(sandbox, files)
    before = snapshot(sandbox)
    problems = []
    try:
        with time_limit(CASE_SECONDS):
            result = call(sandbox)
    except SpecError as error:
        if not names(str(error.field), field):
            problems.append(f"SpecError names field {error.field!r}, not {named}: {error}")
    except TypeError as error:
        message = str(error)
        if len(message) <= 20 or not names(message, field):
            problems.append(f"TypeError without a sentence naming {named}: {message!r}")
    except also as error:
        if not (names(str(error), field) or str(sandbox) in str(error)):
            problems.append(f"{type(error).__name__} does not name {named}: {error}")
    except Exception as error:  # noqa: BLE001 - the wrong kind of error is the bug under test
        problems.append(f"raised {type(error).__name__} (expected SpecError/TypeError naming {named}): "
                        f"{str(error)[:300]}")
    else:
        problems.append(f"accepted (expected a refusal naming {named}); returned {type(result).__name__}")
    problems += tree_changes(before, snapshot(sandbox))
    assert not problems, "; ".join(problems)


def test_table_sizes():
    """The acceptance point asks for at least 120 bad inputs over every command and entry point."""
    assert len(CLI_CASES) + len(API_CASES) >= 120
    commands = {c.values[0][0] for c in CLI_CASES if c.values[0]}
    assert {"generate", "emit", "compile", "run", "fuzz", "bench", "tune", "cache", "families", "catalogue",
            "demo"} <= commands
    entry_points = {c.id.split("-")[0] for c in API_CASES}
    assert {"ConvSpec", "from_dict", "from_json", "plan", "build", "emit", "emit_source"} <= entry_points


# ----------------------------------------------------------------------------------------------
# inputs that must be accepted, or may be either way but never hang or crash
# ----------------------------------------------------------------------------------------------

def test_numpy_integers_are_accepted_in_every_integer_field():
    plain = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=8, input_size=(32, 32), filter_size=(3, 3), stride=(1, 1),
                     padding=1, dilation=1, dpitch=4)
    mixed = ConvSpec(dims=np.int64(2), layout="NHWC", n=np.int64(2), c=np.int32(3), k=np.int16(8),
                     input_size=(np.int64(32), np.uint32(32)), filter_size=np.int64(3),
                     stride=(np.int8(1), np.int64(1)), padding=np.int64(1), dilation=np.uint8(1), dpitch=np.int64(4))
    assert mixed == plain and hash(mixed) == hash(plain)
    assert json.loads(json.dumps(mixed.to_dict())) == plain.to_dict()
    assert mixed.describe() == plain.describe()
    assert codegen.plan("im2col", mixed).spec == plain
    tuples = ConvSpec.from_dict({**GOOD, "n": np.int64(2), "input_size": np.array([32, 32]).tolist()})
    assert tuples.n == 2


def test_numpy_floats_are_refused():
    for name, value in (("n", np.float64(2.0)), ("c", np.float32(3.0)), ("input_size", (np.float64(32.0), 32))):
        with pytest.raises(SpecError) as caught:
            spec(**{name: value})
        assert caught.value.field.startswith(name)


def test_emit_with_arch_none_means_the_default_sm_90(sandbox):
    from codegen.emit import build_flags, emit, emit_source as source

    path = emit("im2col", SPEC, sandbox / "k.cu", arch=None)
    assert build_flags(path.read_text()) == ["-arch=sm_90"]
    assert source("im2col", SPEC, arch=None) == source("im2col", SPEC)


def test_lowercase_layout_is_accepted_or_refused_naming_layout(sandbox, capsys):
    """The CLI upper-cases --layout; a spec file or ConvSpec with 'nhwc' may either be accepted (as
    the flag is) or refused naming layout, but never anything else.  Where both accept, they agree."""
    flag_code = cli.main(["generate", "im2col", "--layout", "nhwc"])
    flag_out = capsys.readouterr().out
    assert flag_code == 0
    (sandbox / "s.json").write_text(spec_json(layout="nhwc"))
    code, err, parser_exit = run_in_process(["generate", "im2col", "--spec", "s.json"], capsys)
    if code != 0:
        check_refusal(code, err, "layout", parser_exit)
    try:
        lower = spec(layout="nhwc")
    except SpecError as error:
        assert error.field == "layout"
    else:
        assert lower == SPEC
    assert flag_out


HUGE_BUT_VALID = [
    ["generate", "im2col", "--n", "1000", "--input", "100000", "100000"],
    ["compile", "im2win", "--n", "1000", "--input", "100000", "100000"],
    ["emit", "implicit_gemm", "--n", "1000", "--input", "100000", "100000", "-o", "big.cu"],
]


@pytest.mark.parametrize("argv", HUGE_BUT_VALID, ids=lambda argv: "-".join(argv[:2]))
def test_huge_but_valid_specs_finish_quickly(argv, tmp_path):
    """A spec past what a GPU holds may be refused (one line) or planned, but must never hang."""
    env = {**os.environ, "CONVGEN_CACHE_DIR": str(tmp_path / "cache"),
           "CONVGEN_TUNING_DB": str(tmp_path / "tuning.json")}
    try:
        result = subprocess.run([str(CONVGEN), *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"convgen {' '.join(argv)} still running after 60 s")
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    if result.returncode != 0:
        check_refusal(result.returncode, result.stderr, ("n=", "input_size", "grid", "workspace", "elements", "size"))
        assert not (tmp_path / "big.cu").exists()


# ----------------------------------------------------------------------------------------------
# the kernel cache's folder: read-only, and holding files that are not the cache's
# ----------------------------------------------------------------------------------------------

def _fake_entry(folder: Path) -> Path:
    """A well-formed cache entry, written as the cache writes them, without compiling anything."""
    from codegen.compile import CompiledKernel, KernelCache

    key = "ab" * 32
    KernelCache(folder).write_disk(CompiledKernel(key=key, arch="sm_90", cubin=b"\x7fELF-not-really", log=""))
    path = folder / f"{key}.cubin"
    assert path.exists()
    return path


def test_cache_clear_on_a_read_only_folder_says_so(sandbox, capsys):
    entry = _fake_entry(sandbox / "cache")
    with read_only(sandbox / "cache"):
        code, err, parser_exit = run_in_process(["cache", "clear"], capsys)
    assert code != 0, "cache clear reported success on a read-only folder"
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1 and ERROR_LINE.match(lines[0]), err[-1500:]
    assert entry.exists()


def test_cache_leaves_foreign_files_alone(sandbox, capsys):
    folder = sandbox / "cache"
    entry = _fake_entry(folder)
    (folder / "notes.cubin").write_text("my notes, not a kernel\n")
    (folder / "x.txt").write_text("mine\n")
    assert cli.main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert re.search(r"^entries\s+1$", info, re.MULTILINE), info
    assert re.search(rf"^bytes\s+{entry.stat().st_size}$", info, re.MULTILINE), info
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 " in capsys.readouterr().out
    assert not entry.exists()
    assert (folder / "notes.cubin").read_text() == "my notes, not a kernel\n"
    assert (folder / "x.txt").read_text() == "mine\n"
