"""What the heuristics know of the GPU a kernel is chosen for: a ``Device`` description.

Read from the device when there is one, else taken from a named target (``--target a100``), or
from the reference card of an architecture (``arch=sm_80`` describes an A100), so that ``emit``
and ``compile`` on a machine without a GPU choose tiles for the card the file will run on.  Every
heuristic reads the description it is given (SM count for waves and tile counts, shared memory and
registers for resident blocks) instead of assuming the H100 the rules were measured on.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from codegen.spec import SpecError


@dataclass(frozen=True)
class Device:
    """One GPU as the heuristics see it; sizes in bytes."""

    name: str
    arch: str
    sm_count: int
    shared_per_sm: int
    shared_per_block: int
    """The opt-in maximum of dynamic shared memory a block may have."""
    registers_per_sm: int = 65536
    l2_bytes: int = 0

    @property
    def capability(self) -> int:
        return int("".join(ch for ch in self.arch[3:] if ch.isdigit()))


KB, MB = 1 << 10, 1 << 20
SHARED_PER_BLOCK_OPT_IN = {75: 64 * KB, 80: 163 * KB, 86: 99 * KB, 87: 163 * KB, 88: 99 * KB, 89: 99 * KB,
                           90: 227 * KB, 100: 227 * KB, 103: 227 * KB, 110: 227 * KB, 120: 99 * KB, 121: 99 * KB}
"""Shared memory a block may opt into, per compute capability (the CUDA programming guide's table
of technical specifications: the SM's shared memory less the 1 KB the driver reserves a block
from sm_80 on)."""


def max_shared_per_block(capability: int) -> int:
    """The opt-in shared memory per block of ``capability``; for one newer than the table, the
    smallest in it (a target it cannot name is not assumed to be large)."""
    return SHARED_PER_BLOCK_OPT_IN.get(capability, min(SHARED_PER_BLOCK_OPT_IN.values()))


def _shared_per_sm(capability: int) -> int:
    return max_shared_per_block(capability) + (KB if capability >= 80 else 0)


def _card(name: str, arch: str, sm_count: int, l2_megabytes: int) -> Device:
    """A named card: its shared memory is its compute capability's."""
    capability = int(arch[3:])
    return Device(name, arch, sm_count, _shared_per_sm(capability), max_shared_per_block(capability),
                  l2_bytes=l2_megabytes * MB)


TARGETS = {card.name: card for card in (
    _card("h100", "sm_90", 132, 50), _card("h100-pcie", "sm_90", 114, 50), _card("h200", "sm_90", 132, 50),
    _card("b200", "sm_100", 148, 126), _card("a100", "sm_80", 108, 40), _card("a10", "sm_86", 72, 6),
    _card("rtx3090", "sm_86", 82, 6), _card("l4", "sm_89", 58, 48), _card("l40s", "sm_89", 142, 96),
    _card("rtx4090", "sm_89", 128, 72), _card("rtx5090", "sm_120", 170, 96), _card("t4", "sm_75", 40, 4))}
"""Named targets: SM counts and L2 sizes from the vendors' specification sheets."""
REFERENCE = TARGETS["h100"]
"""The card the heuristics' rules were measured on, and the description where none is given."""
REFERENCE_BY_CAPABILITY = {90: "h100", 100: "b200", 80: "a100", 86: "a10", 89: "l40s", 120: "rtx5090", 75: "t4"}
"""Which named target an architecture alone stands for (``arch=sm_80`` with no ``target``)."""
FIELDS = tuple(f.name for f in dataclasses.fields(Device) if f.name not in ("name", "arch"))


def present() -> Device | None:
    """The current CUDA device as read from the driver, or None without one."""
    from codegen.compile import device_arch

    arch = device_arch()
    if arch is None:
        return None
    import cupy

    return _read(cupy.cuda.Device().id, arch)


@functools.lru_cache(maxsize=None)
def _read(device_id: int, arch: str) -> Device:
    """A device's properties, read once (every plan asks which card it is chosen for)."""
    import cupy

    properties = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = properties["name"]
    return Device(name.decode() if isinstance(name, bytes) else str(name), arch,
                  sm_count=properties["multiProcessorCount"],
                  shared_per_sm=properties["sharedMemPerMultiprocessor"],
                  shared_per_block=properties["sharedMemPerBlockOptin"],
                  registers_per_sm=properties["regsPerMultiprocessor"],
                  l2_bytes=properties["l2CacheSize"])


def named(text: str) -> Device:
    """``NAME`` or ``NAME,field=value,...`` (e.g. ``h100,sm_count=114``): a named target with
    explicit numbers in place of some of its own."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError("target", text, f"must name a target ({', '.join(TARGETS)}), optionally with fields, "
                        "e.g. h100,sm_count=114")
    base, *overrides = [part.strip() for part in text.split(",")]
    if base.lower() not in TARGETS:
        raise SpecError("target", text, f"names no known card; the targets are {', '.join(TARGETS)} (add "
                        f"field=value pairs for another: {', '.join(FIELDS)})")
    device = TARGETS[base.lower()]
    changes = {}
    for item in overrides:
        field, _, value = item.partition("=")
        if field not in FIELDS or not value.strip().isdigit() or int(value) < 1:
            raise SpecError("target", text, f"'{item}' must be FIELD=POSITIVE_INTEGER with FIELD one of "
                            f"{', '.join(FIELDS)}")
        changes[field] = int(value)
    return dataclasses.replace(device, name=text if changes else device.name, **changes)


def for_arch(arch: str) -> Device:
    """The description an architecture alone stands for: its reference card with that arch, and
    that arch's shared memory (an sm_121 has 99 KB a block whichever card stands for it)."""
    from codegen.compile import compute_capability

    capability = compute_capability(arch)
    reference = TARGETS[REFERENCE_BY_CAPABILITY.get(capability, "h100")]
    return dataclasses.replace(reference, arch=arch, shared_per_sm=_shared_per_sm(capability),
                               shared_per_block=max_shared_per_block(capability))


def resolve(target: Device | str | None, arch: str | None) -> Device:
    """The description a build, compile or emit chooses for: ``target`` (a Device or a name), else
    the current device where ``arch`` is its own (or not given), else the reference card of
    ``arch``, else the H100.  A target and an arch of another compute capability are refused."""
    from codegen.compile import compute_capability, resolve_arch

    if target is None:
        here = present()
        if here is not None and (arch is None or compute_capability(resolve_arch(arch)) == here.capability):
            return here if arch is None else dataclasses.replace(here, arch=resolve_arch(arch))
        return REFERENCE if arch is None else for_arch(resolve_arch(arch))
    device = target if isinstance(target, Device) else named(target)
    if arch is not None and compute_capability(resolve_arch(arch)) != device.capability:
        raise SpecError("arch", arch, f"is not the architecture of target {device.name} ({device.arch}); leave "
                        "one of them out")
    return device if arch is None else dataclasses.replace(device, arch=resolve_arch(arch))


def as_device(description: Device | str | None) -> Device:
    """A heuristic's argument: a Device, an arch (``sm_80``: its reference card), a target name,
    or None (the H100 the rules were measured on)."""
    if description is None:
        return REFERENCE
    if isinstance(description, Device):
        return description
    if description.startswith("sm_"):
        return for_arch(description)
    return named(description)
