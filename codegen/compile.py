"""NVRTC compilation through CuPy, with a hash-keyed cubin cache in memory and on disk.

The key is sha256 over the source, the options, the NVRTC build and the architecture, so a
cached binary can only be served for exactly the input that produced it.  Disk entries carry a
sha256 of their payload and are written to a temporary file then renamed, so a half-written or
altered entry is detected, rebuilt and replaced instead of loaded.  NVRTC needs no GPU: compiling
to cubin works on any machine with the NVRTC library.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ENTRY_MAGIC = b"CONVGEN-CUBIN-1\n"
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.cubin")
_TEMP_NAME = re.compile(r"\.tmp-[a-z0-9_]{8}")
STALE_TEMP_SECONDS = 3600
"""An empty ``.tmp-`` file older than this is a convgen writer's leftover (see KernelCache._scan)."""
DEFAULT_ARCH = "sm_90"
BASE_OPTIONS = ("-std=c++17", "--ptxas-options=-v", "-lineinfo")


class CompileError(RuntimeError):
    """NVRTC rejected the source; the message carries its log."""


class CacheError(OSError):
    """The kernel cache's folder could not be read or cleared; ``str()`` is one line."""


@dataclass(frozen=True)
class FunctionResources:
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int


@dataclass
class CompiledKernel:
    key: str
    arch: str
    cubin: bytes
    log: str
    source_hit: str = "miss"
    compile_seconds: float = 0.0
    resources: dict[str, FunctionResources] = field(default_factory=dict)

    @property
    def warnings(self) -> list[str]:
        return [line for line in self.log.splitlines() if "warning" in line.lower()]


def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """Which NVRTC compiles, for the cache key.

    The pip wheel's exact version (e.g. 13.0.88) is read from its metadata, which costs
    microseconds; loading the library just to ask it (what a bare ``getVersion`` needs) costs
    ~200 ms and would make a disk hit in a new process slower than compiling.  Without the wheel
    (a system toolkit) the library is loaded and asked."""
    try:
        return "nvidia-cuda-nvrtc " + importlib.metadata.version("nvidia-cuda-nvrtc")
    except importlib.metadata.PackageNotFoundError:
        major, minor = nvrtc_version()
        return f"nvrtc {major}.{minor}"


def device_arch() -> str | None:
    """``sm_XY`` of the current device, or None when there is no usable GPU."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return f"sm_{cupy.cuda.Device().compute_capability}"
    except Exception:  # no driver, no device: compile-only machine
        return None


def resolve_arch(arch: str | None) -> str:
    """The requested architecture, else the device's, else sm_90 (the GPU this project targets)."""
    from codegen.spec import SpecError

    if arch is None:
        return device_arch() or DEFAULT_ARCH
    if not isinstance(arch, str) or not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
        raise SpecError("arch", arch, "must look like sm_90 (sm_ followed by the compute capability, e.g. sm_80, "
                        "sm_90, sm_90a)")
    supported = supported_capabilities()
    if compute_capability(arch) not in supported:
        raise SpecError("arch", arch, f"is not a target this NVRTC ({compiler_fingerprint()}) builds for; it "
                        f"takes {', '.join(f'sm_{cc}' for cc in supported)}")
    return arch


@functools.lru_cache(maxsize=1)
def supported_capabilities() -> tuple[int, ...]:
    """The compute capabilities NVRTC can compile for (NVRTC 13.0: 75 to 121); emitted files name the
    same targets, since the toolkit's nvcc takes the same set."""
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getSupportedArchs())


def compute_capability(arch: str) -> int:
    """The compute capability of a resolved architecture as one number: 90 for sm_90 and sm_90a."""
    return int("".join(ch for ch in arch[3:] if ch.isdigit()))


NVRTC_CACHE_FIRST = (12, 9)
"""The first NVRTC with a cache of its own, which ``--no-cache`` turns off."""


def options_for(arch: str) -> tuple[str, ...]:
    """NVRTC's options for ``arch``, with NVRTC's own cache off where it has one: with a GPU driver
    present NVRTC keeps compiled programs under ~/.nv/ComputeCache, and a program served from there
    comes back with an empty log, so ptxas's report of registers and spills is lost and every check
    on it passes vacuously (measured on the H100 with NVRTC 13.0.88: the same source compiled twice,
    in one process or two, gave the report only the first time; nvFuser turns the cache off for the
    same reason).  convgen's own cache already serves a program compiled before, report included."""
    return (f"-arch={arch}", *BASE_OPTIONS, *(("--no-cache",) if nvrtc_version() >= NVRTC_CACHE_FIRST else ()))


def cache_key(source: str, options: tuple[str, ...], compiler: str, arch: str) -> str:
    digest = hashlib.sha256()
    for part in (source, "\0".join(options), compiler, arch):
        digest.update(part.encode())
        digest.update(b"\x00\xff")
    return digest.hexdigest()


_RESOURCE_RE = re.compile(
    r"Function properties for (?P<name>\S+)\s*\n.*?(?P<stack>\d+) bytes stack frame, (?P<ss>\d+) bytes spill stores, "
    r"(?P<sl>\d+) bytes spill loads\s*\n.*?Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<smem>\d+) bytes smem)?",
    re.S,
)


def parse_resources(log: str) -> dict[str, FunctionResources]:
    """Registers, shared memory, stack and spills per function from ptxas' verbose report."""
    found = {}
    for match in _RESOURCE_RE.finditer(log):
        found[match["name"]] = FunctionResources(
            registers=int(match["regs"]),
            shared_bytes=int(match["smem"] or 0),
            stack_bytes=int(match["stack"]),
            spill_stores=int(match["ss"]),
            spill_loads=int(match["sl"]),
        )
    return found


def default_cache_dir() -> Path:
    env = os.environ.get("CONVGEN_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convgen"


class KernelCache:
    """A dict in memory plus entries on disk; degrades to memory alone when the disk fails."""

    def __init__(self, directory: Path | None = None):
        self._directory = directory
        self._memory: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self._disk_ok = True
        self._warned = False

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else default_cache_dir()

    def _entry_path(self, key: str) -> Path:
        return self.directory / f"{key}.cubin"

    def _disable_disk(self, reason: str) -> None:
        self._disk_ok = False
        if not self._warned:
            self._warned = True
            warnings.warn(f"convgen: kernel cache directory {self.directory} is unusable ({reason}); "
                          "caching in memory only", RuntimeWarning, stacklevel=3)

    def get_memory(self, key: str) -> CompiledKernel | None:
        with self._lock:
            return self._memory.get(key)

    def put_memory(self, kernel: CompiledKernel) -> None:
        with self._lock:
            self._memory[kernel.key] = kernel

    def read_disk(self, key: str) -> CompiledKernel | None:
        """The entry for ``key`` if present and intact; a damaged entry counts as absent."""
        if not self._disk_ok:
            return None
        path = self._entry_path(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        header = len(ENTRY_MAGIC) + 32
        if not blob.startswith(ENTRY_MAGIC) or len(blob) < header:
            return None
        digest, payload = blob[len(ENTRY_MAGIC):header], blob[header:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        meta_len = int.from_bytes(payload[:8], "little")
        try:
            meta = json.loads(payload[8:8 + meta_len])
        except ValueError:
            return None
        if meta.get("key") != key:
            return None
        kernel = CompiledKernel(key=key, arch=meta["arch"], cubin=payload[8 + meta_len:], log=meta["log"],
                                source_hit="disk")
        kernel.resources = parse_resources(kernel.log)
        return kernel

    def write_disk(self, kernel: CompiledKernel) -> None:
        if not self._disk_ok:
            return
        meta = json.dumps({"key": kernel.key, "arch": kernel.arch, "log": kernel.log}).encode()
        payload = len(meta).to_bytes(8, "little") + meta + kernel.cubin
        blob = ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(blob)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, self._entry_path(kernel.key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
        except OSError as err:
            self._disable_disk(err.strerror or str(err))

    def _scan(self) -> tuple[list[Path], list[Path], int]:
        """The folder's convgen entries, convgen temporaries, and how many other things it holds.

        An entry is ``<64 lowercase hex>.cubin`` whose file starts with ``ENTRY_MAGIC``.  A temporary
        is named as write_disk's mkstemp names them (``.tmp-`` and 8 characters) and either starts
        with ``ENTRY_MAGIC`` (write_disk writes the whole blob in one call) or is empty and older than
        ``STALE_TEMP_SECONDS`` (a writer killed between mkstemp and its write).  Anything else,
        symlinks and folders included, is not the cache's: it is neither counted nor removed.
        """
        directory = self.directory
        entries: list[Path] = []
        temps: list[Path] = []
        foreign = 0
        try:
            listing = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return entries, temps, foreign
        except OSError as err:
            raise CacheError(f"cannot read the cache folder {directory} ({err.strerror or err})") from err
        for item in listing:
            path = Path(item.path)
            if not item.is_file(follow_symlinks=False):
                foreign += 1
            elif _ENTRY_NAME.fullmatch(item.name) and _starts_with_magic(path):
                entries.append(path)
            elif _TEMP_NAME.fullmatch(item.name) and (_starts_with_magic(path) or _stale_and_empty(item)):
                temps.append(path)
            else:
                foreign += 1
        return sorted(entries), sorted(temps), foreign

    def info(self) -> dict:
        """The cache's entries on disk; ``foreign`` counts the other things in its folder, which
        clear leaves alone (the tuning database lives there too)."""
        entries, _, foreign = self._scan()
        sizes = []
        for path in entries:
            with contextlib.suppress(FileNotFoundError):
                sizes.append(path.stat().st_size)
        return {
            "directory": str(self.directory),
            "entries": len(sizes),
            "bytes": sum(sizes),
            "in_memory": len(self._memory),
            "foreign": foreign,
        }

    def clear(self) -> int:
        """Remove convgen's entries and temporaries, never other files; returns how many went.

        Raises ``CacheError`` (one line: counts, first reason, folder) when any could not be removed,
        so that a read-only folder is not reported as cleared."""
        with self._lock:
            self._memory.clear()
        entries, temps, _ = self._scan()
        removed = 0
        failures: list[OSError] = []
        for path in entries + temps:
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
            except OSError as err:
                failures.append(err)
        if failures:
            raise CacheError(f"removed {removed} of {removed + len(failures)} entries from {self.directory}: "
                             f"{len(failures)} could not be removed ({failures[0].strerror or failures[0]})")
        return removed


def _starts_with_magic(path: Path) -> bool:
    """Whether ``path`` begins like a convgen entry; one that cannot be read is not provably ours."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(ENTRY_MAGIC)) == ENTRY_MAGIC
    except OSError:
        return False


def _stale_and_empty(item: os.DirEntry) -> bool:
    try:
        info = item.stat(follow_symlinks=False)
    except OSError:
        return False
    return info.st_size == 0 and time.time() - info.st_mtime > STALE_TEMP_SECONDS


_CACHE: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process-wide cache; its directory follows CONVGEN_CACHE_DIR at first use."""
    global _CACHE
    if _CACHE is None:
        _CACHE = KernelCache()
    return _CACHE


def nvrtc_compile(source: str, name: str, options: tuple[str, ...]) -> tuple[bytes, str]:
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(options))
        except nvrtc.NVRTCError as err:
            log = nvrtc.getProgramLog(program).rstrip("\x00")
            raise CompileError(f"NVRTC failed on {name} ({err}):\n{log}") from None
        log = nvrtc.getProgramLog(program).rstrip("\x00")
        return nvrtc.getCUBIN(program), log
    finally:
        nvrtc.destroyProgram(program)


def compile_source(source: str, name: str = "convgen.cu", arch: str | None = None,
                   cache: KernelCache | None = None) -> CompiledKernel:
    """Compile ``source`` to a cubin for ``arch``, serving memory then disk hits."""
    cache = cache or default_cache()
    arch = resolve_arch(arch)
    options = options_for(arch)
    key = cache_key(source, options, compiler_fingerprint(), arch)
    hit = cache.get_memory(key)
    if hit is not None:
        return dataclasses.replace(hit, source_hit="memory", compile_seconds=0.0)
    hit = cache.read_disk(key)
    if hit is not None:
        cache.put_memory(hit)
        return hit
    start = time.perf_counter()
    cubin, log = nvrtc_compile(source, name, options)
    kernel = CompiledKernel(key=key, arch=arch, cubin=cubin, log=log, source_hit="miss",
                            compile_seconds=time.perf_counter() - start, resources=parse_resources(log))
    cache.put_memory(kernel)
    cache.write_disk(kernel)
    return kernel
