"""What the heuristics know of the GPU a kernel is chosen for: a ``Device`` description.

Read from the device when there is one, else taken from a named target (``--target a100``), or
from the reference card of an architecture (``arch=sm_80`` describes an A100), so that ``emit``
and ``compile`` on a machine without a GPU choose tiles for the card the file will run on.  Every
heuristic reads the description it is given (SM count for waves and tile counts, shared memory and
registers for resident blocks) instead of assuming the H100 the rules were measured on.
"""
from __future__ import annotations

import dataclasses
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
    threads_per_sm: int = 2048
    l2_bytes: int = 0

    @property
    def capability(self) -> int:
        return int("".join(ch for ch in self.arch[3:] if ch.isdigit()))

    def describe(self) -> str:
        return (f"{self.name} ({self.arch}, {self.sm_count} SMs, {self.shared_per_block >> 10} KB shared a block, "
                f"{self.l2_bytes >> 20} MB L2)")


KB, MB = 1 << 10, 1 << 20
TARGETS = {
    "h100": Device("h100", "sm_90", 132, 228 * KB, 227 * KB, l2_bytes=50 * MB),
    "h100-pcie": Device("h100-pcie", "sm_90", 114, 228 * KB, 227 * KB, l2_bytes=50 * MB),
    "h200": Device("h200", "sm_90", 132, 228 * KB, 227 * KB, l2_bytes=50 * MB),
    "b200": Device("b200", "sm_100", 148, 228 * KB, 227 * KB, l2_bytes=126 * MB),
    "a100": Device("a100", "sm_80", 108, 164 * KB, 163 * KB, l2_bytes=40 * MB),
    "a10": Device("a10", "sm_86", 72, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=6 * MB),
    "rtx3090": Device("rtx3090", "sm_86", 82, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=6 * MB),
    "l4": Device("l4", "sm_89", 58, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=48 * MB),
    "l40s": Device("l40s", "sm_89", 142, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=96 * MB),
    "rtx4090": Device("rtx4090", "sm_89", 128, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=72 * MB),
    "rtx5090": Device("rtx5090", "sm_120", 170, 100 * KB, 99 * KB, threads_per_sm=1536, l2_bytes=96 * MB),
    "t4": Device("t4", "sm_75", 40, 64 * KB, 64 * KB, threads_per_sm=1024, l2_bytes=4 * MB),
}
"""Named targets, from the vendors' specification sheets and the CUDA programming guide's table of
technical specifications per compute capability."""
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

    properties = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = properties["name"]
    return Device(name.decode() if isinstance(name, bytes) else str(name), arch,
                  sm_count=properties["multiProcessorCount"],
                  shared_per_sm=properties["sharedMemPerMultiprocessor"],
                  shared_per_block=properties["sharedMemPerBlockOptin"],
                  registers_per_sm=properties["regsPerMultiprocessor"],
                  threads_per_sm=properties["maxThreadsPerMultiProcessor"],
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
    """The description an architecture alone stands for: its reference card with that arch."""
    from codegen.compile import compute_capability

    reference = TARGETS[REFERENCE_BY_CAPABILITY.get(compute_capability(arch), "h100")]
    return dataclasses.replace(reference, arch=arch)


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
