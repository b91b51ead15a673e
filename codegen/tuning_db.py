"""The tuning database that ``build`` consults, and the chooser that puts it first.

A record holds the tiles ``convgen tune`` measured fastest for one (family, spec, GPU, convgen
version, workspace limit), with a fingerprint of the kernel code they rendered to: a record whose
code has changed since is not used.  This module sits just above the families' plans (it renders
a plan to fingerprint it) and below ``api.plan``, which takes ``tuned_or_heuristic`` as its
default chooser; the search that writes records (``codegen.tune``) sits above both.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from codegen import device as devices
from codegen import render
from codegen.device import Device
from codegen.families import get_family
from codegen.files import EmitError, write_if_changed
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import Tiles
from codegen.version import __version__


class DatabaseError(OSError):
    """The tuning database could not be written; ``str()`` is one line naming the file."""


def default_db_path() -> Path:
    from codegen.compile import default_cache_dir

    override = os.environ.get("CONVGEN_TUNING_DB")
    return Path(override) if override else default_cache_dir() / "tuning.json"


def entry_key(family: str, spec: ConvSpec, device: tuple[str, str], version: str = __version__,
              workspace_limit: int | None = None) -> str:
    """Family, spec (which is tile-free; its description names dtype and math, so a bfloat16 or tf32
    record never serves a float32 build of the same shape), GPU name, compute capability and
    generator version, and the workspace limit the search was held to, if any: a record tuned under
    a limit serves builds under that limit only, since without it a faster configuration may need
    more memory."""
    parts = [family, spec.describe(), device[0], device[1], version]
    if workspace_limit is not None:
        parts.append(f"workspace <= {workspace_limit} B")
    return " | ".join(parts)


class TuningDB:
    """A JSON file of tuned configurations; every write replaces the file atomically.  A file that
    does not parse is reported and read as empty; the first write moves it aside
    (``*.corrupt-<time>``) rather than over it, and a read never moves anything.  A path that is not
    a readable file (a folder, no permission) is refused as ``--db``."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path else default_db_path()
        self._entries: dict[str, dict] | None = None
        self._stamp: float | None = None
        self._corrupt = False

    def entries(self) -> dict[str, dict]:
        stamp = self.path.stat().st_mtime if self.path.exists() else None
        if self._entries is None or stamp != self._stamp:
            self._entries, self._stamp = self._load(), stamp
        return self._entries

    def _load(self) -> dict[str, dict]:
        self._corrupt = False
        if not self.path.exists():
            return {}
        try:
            raw = self.path.read_bytes()
        except OSError as err:
            raise SpecError("--db", str(self.path), f"cannot be read as a tuning database "
                            f"({err.strerror or err})") from None
        try:
            data = json.loads(raw.decode("utf-8"))      # a UnicodeDecodeError is a ValueError too
            if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
                raise ValueError("no 'entries' object")
            return data["entries"]
        except ValueError as err:
            self._corrupt = True
            warnings.warn(f"convgen: tuning database {self.path} is unreadable ({err}); using the heuristic "
                          "until it is tuned again (the next record moves the file aside)", stacklevel=3)
            return {}

    def _move_aside_if_corrupt(self) -> None:
        if self._corrupt and self.path.is_file():
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            os.replace(self.path, aside)
            warnings.warn(f"convgen: moved the unreadable tuning database {self.path} to {aside}", stacklevel=4)
            self._corrupt = False

    def _write(self, entries: dict[str, dict]) -> None:
        """Replace the file atomically; a failure leaves it as it was and raises ``DatabaseError``."""
        try:
            self._move_aside_if_corrupt()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temp = tempfile.mkstemp(prefix=".tuning-", dir=self.path.parent)
        except OSError as err:
            blocking = next((p for p in self.path.parents if p.exists()), None)
            reason = (f"{blocking} is a file, not a folder" if blocking is not None and not blocking.is_dir()
                      else err.strerror or str(err))
            raise DatabaseError(f"cannot write the tuning database {self.path} (--db): {reason}") from err
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"format": 1, "entries": entries}, out, indent=1, sort_keys=True)
            os.replace(temp, self.path)
        except BaseException as err:
            Path(temp).unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise DatabaseError(f"cannot write the tuning database {self.path} (--db): "
                                    f"{err.strerror or err}") from err
            raise
        self._entries, self._stamp = entries, self.path.stat().st_mtime

    def lookup(self, family: str, spec: ConvSpec, device: tuple[str, str],
               workspace_limit: int | None = None) -> dict | None:
        """The recorded tiles, unless the code they render to is not the code that was timed."""
        key = entry_key(family, spec, device, workspace_limit=workspace_limit)
        entry = self.entries().get(key)
        if not entry:
            return None
        if not timed_this_code(entry, family, spec):
            if key not in _WARNED_STALE:
                _WARNED_STALE.add(key)
                warnings.warn(f"convgen: the tuned record for {family} {spec.describe()} in {self.path} timed "
                              "other kernel code (the templates changed since, or the record predates "
                              "fingerprints); using the heuristic until `convgen tune` runs again", stacklevel=3)
            return None
        return dict(entry["tiles"])

    def record(self, family: str, spec: ConvSpec, device: tuple[str, str], tiles: dict,
               workspace_limit: int | None = None, **facts: Any) -> None:
        entries = dict(self.entries())
        limit = {} if workspace_limit is None else {"workspace_limit": workspace_limit}
        entries[entry_key(family, spec, device, workspace_limit=workspace_limit)] = {
            "family": family, "spec": spec.to_dict(), "gpu": device[0], "arch": device[1], "version": __version__,
            "tiles": tiles, "recorded": time.strftime("%Y-%m-%d %H:%M:%S"), **limit, **facts}
        self._write(entries)

    def export(self, path: Path | str) -> int:
        """Write the entries to ``path`` as emit writes its files (``emit.write_if_changed``)."""
        entries = self.entries()
        try:
            write_if_changed(Path(path), json.dumps({"format": 1, "entries": entries}, indent=1, sort_keys=True))
        except EmitError as err:
            raise SpecError("--export", str(path), str(err)) from None
        return len(entries)

    def import_(self, path: Path | str) -> int:
        """Merge another database's entries (theirs win on equal keys); returns how many."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            incoming = data["entries"]
            if not isinstance(incoming, dict):
                raise ValueError("'entries' is not an object")
            for key, entry in incoming.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("tiles"), dict):
                    raise ValueError(f"entry {key!r} has no tiles")
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SpecError("--import", str(path), f"is not a convgen tuning database ({err})") from None
        self._write({**self.entries(), **incoming})
        return len(incoming)


_WARNED_STALE: set[str] = set()


def timed_this_code(entry: dict, family: str, spec: ConvSpec) -> bool:
    """Whether a record's tiles still render to the kernel code it timed (its fingerprint)."""
    return entry.get("kernel") == kernel_fingerprint(family, spec, entry["tiles"])


def is_current(entry: dict) -> bool:
    """``timed_this_code`` for a stored entry; tiles that no longer plan count as stale."""
    try:
        return timed_this_code(entry, entry["family"], ConvSpec.from_dict(entry["spec"]))
    except (SpecError, TypeError, ValueError):
        return False


KERNEL_TAG = re.compile(r"(convgen_\w*?_)[0-9a-f]{10}(?![0-9A-Za-z])")
"""The hash tag of a kernel name (``base.kernel_name``): a digest of the spec and tiles, which a
record's key and tiles hold already, so the fingerprint leaves it out."""


def kernel_fingerprint(family: str, spec: ConvSpec, tiles: dict) -> str:
    """sha256 (16 hex digits) of the kernel code ``tiles`` render to for ``spec``, comments, blank
    lines and the kernel names' tags left out, so that a reworded comment or a new tile field at
    its default (which renames the kernel) keeps a record, and any code change retires it."""
    return _fingerprint(family, spec, json.dumps(tiles, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _fingerprint(family: str, spec: ConvSpec, tiles_json: str) -> str:
    """Rendering takes ~0.1 s; a process asks again for every build of a tuned spec."""
    fam = get_family(family, spec)
    code = render.render_kernels(fam.plan(spec, fam.complete_tiles(spec, json.loads(tiles_json)))).code
    lines = (re.sub(r"//.*$", "", KERNEL_TAG.sub(r"\1", line)).rstrip() for line in code.splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()[:16]


_OPEN_DBS: dict[Path, TuningDB] = {}
"""One database object per path, so every build does not parse the file again (it re-reads it
only when its modification time changes)."""


def current_device() -> tuple[str, str] | None:
    """(GPU name, sm_XX) of the current device, None without one (then nothing is looked up)."""
    here = devices.present()
    return None if here is None else (here.name, here.arch)


def tuned_tiles(family: str, spec: ConvSpec, db: TuningDB | None = None,
                workspace_limit: int | None = None) -> dict | None:
    """The tuned configuration for this family, spec, GPU and version (and workspace limit), if
    one was recorded."""
    device = current_device()
    if device is None:
        return None
    if db is None:
        path = default_db_path()
        db = _OPEN_DBS.setdefault(path, TuningDB(path))
    return db.lookup(family, spec, device, workspace_limit)


def tuned_or_heuristic(fam, spec: ConvSpec, card: Device, workspace_limit: int | None = None) -> Tiles:
    """``api.plan``'s default chooser: where ``card`` is this machine's GPU, the tuned
    configuration recorded for it and this version when there is one (it still plans and renders
    to the kernel code that was timed), else the family's heuristic for ``card``; a database
    problem never stops a build.  Under a workspace limit, the record tuned under that limit comes
    first, then the one tuned without a limit (``plan`` holds either to the limit).  A record is
    used as it was measured: a field added since (split_k) takes its declared default, not the
    heuristic's."""
    here = current_device()
    if here is not None and here[0] == card.name:
        for limit in (None,) if workspace_limit is None else (workspace_limit, None):
            try:
                tuned = tuned_tiles(fam.name, spec, workspace_limit=limit)
                if tuned is not None:
                    return fam.tiles_type.from_dict(tuned)
            except (SpecError, TypeError, ValueError):
                pass
    return fam.heuristic_tiles(spec, card)
