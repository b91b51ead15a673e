"""The catalogue in generated/: standalone files for the benchmark layers, kept fresh by a test.

Each entry is emitted for the benchmark's own shapes (batch 128 for the twelve layers), so a
project can take the file for its layer and build it with plain nvcc.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codegen.bench.layers import BATCH, layer_spec, load_shapes
from codegen.emit import emit_source
from codegen.files import write_if_changed
from codegen.device import TARGETS
from codegen.families import direct, gemm_heuristic, get_family, wgmma_gemm
from codegen.spec import ConvSpec, replace

GENERATED = Path(__file__).resolve().parent.parent / "generated"
FAMILY_TILES = {"im2col": (None,), "col2im": ({"algorithm": "gather"}, {"algorithm": "scatter"})}
TENSOR_CORE_PRECISIONS = {"bf16": {"dtype": "bfloat16"}, "tf32": {"math": "tf32"}}
"""The tensor-core implicit GEMM's entries: each benchmark layer in BF16 and in TF32 (float32 data),
named by the suffix."""
WGMMA_TARGET = TARGETS["h100"]
"""The card whose heuristic picks the WGMMA entries' tiles (sm_90a files run on sm_90 alone)."""
TENSOR_CORE_LAYOUTS = ("NHWC", "NDHWC")
"""Layouts of the tensor-core entries: channels-last only, the layout tensor-core convolutions run in
(cuDNN's and CUTLASS's) and the one whose A tile comes in 16-byte copies; the channels-first ones
would double the entries (32 more files, 0.8 MB) for kernels that the tests build anyway."""


@dataclass(frozen=True)
class Entry:
    family: str
    name: str
    spec: ConvSpec
    tiles: dict | None

    @property
    def path(self) -> Path:
        return GENERATED / self.family / f"{self.name}.cu"

    @property
    def launcher(self) -> str:
        return f"convgen_{self.family}_{self.name}"

    def source(self) -> str:
        return emit_source(self.family, self.spec, self.tiles, self.launcher, self.path.name)


def entries() -> list[Entry]:
    """im2col and col2im for the twelve 2D layers; direct for the single-channel filters (every
    variant) and the 3D layers (both layouts, default tiles); implicit GEMM for the twelve and the
    3D layers in both layouts, plus its TMA kernel (sm_90) in the channels-last layouts it takes
    and the channels-first ones where its gathered A tile pays, and its tensor-core kernel (sm_80)
    in BF16 and TF32 in the channels-last layouts, with its WGMMA variant (sm_90a, the H100's
    heuristic tiles) where that takes the layer; and im2win in the benchmark's channels-first
    layouts (heuristic tiles, batch as benchmarked)."""
    shapes = load_shapes()
    found = []
    for layer in shapes["conv2d_mec"] + shapes["conv3d"]:
        layouts = ("NCHW", "NHWC") if "D" not in layer else ("NCDHW", "NDHWC")
        for layout in layouts:
            spec = layer_spec(layer, layout, layer.get("N", BATCH))
            found.append(Entry("implicit_gemm", f"{layer['name']}_{layout.lower()}", spec, _heuristic("implicit_gemm", spec)))
            if gemm_heuristic.tma_suits(spec) and (spec.layout.channels_last or gemm_heuristic.gather_pays(spec)):
                found.append(Entry("implicit_gemm", f"{layer['name']}_{layout.lower()}_tma", spec,
                                   gemm_heuristic.tma_tiles(spec).to_dict()))
            if layout in TENSOR_CORE_LAYOUTS:
                for suffix, precision in TENSOR_CORE_PRECISIONS.items():
                    tensor_spec = replace(spec, **precision)
                    found.append(Entry("implicit_gemm", f"{layer['name']}_{layout.lower()}_{suffix}", tensor_spec,
                                       _heuristic("implicit_gemm", tensor_spec)))
                    if wgmma_gemm.covers(tensor_spec):
                        found.append(Entry("implicit_gemm", f"{layer['name']}_{layout.lower()}_{suffix}_wgmma",
                                           tensor_spec, wgmma_gemm.heuristic_fields(tensor_spec, WGMMA_TARGET)))
            if layout in ("NCHW", "NCDHW"):
                found.append(Entry("im2win", f"{layer['name']}_{layout.lower()}", spec, _heuristic("im2win", spec)))
    for layer in shapes["filter2d"]:
        spec = layer_spec(layer, "NCHW", layer["N"])
        for variant in direct.VARIANTS:
            tiles = get_family("direct").complete_tiles(spec, {"variant": variant}).to_dict()
            found.append(Entry("direct", f"{layer['name']}_{variant}", spec, tiles))
    for layer in shapes["conv3d"]:
        for layout in ("NCDHW", "NDHWC"):
            spec = layer_spec(layer, layout, layer["N"])
            found.append(Entry("direct", f"{layer['name']}_{layout.lower()}", spec, _heuristic("direct", spec)))
    for layer in shapes["conv2d_mec"]:
        for layout in ("NCHW", "NHWC"):
            spec = layer_spec(layer, layout, BATCH)
            for family, tile_options in FAMILY_TILES.items():
                for tiles in tile_options:
                    suffix = f"_{tiles['algorithm']}" if tiles else ""
                    found.append(Entry(family, f"{layer['name']}_{layout.lower()}{suffix}", spec, tiles))
    return found


def _heuristic(family: str, spec: ConvSpec) -> dict:
    """Explicit heuristic tiles, so that a tuning database on the machine never changes the catalogue."""
    return get_family(family, spec).default_tiles(spec).to_dict()


def stale_files() -> list[Path]:
    """Catalogue files that are missing or differ from what the generator renders now, plus strays."""
    wanted = {entry.path: entry for entry in entries()}
    stale = [path for path, entry in wanted.items() if not path.exists() or path.read_text() != entry.source()]
    strays = [p for p in GENERATED.rglob("*.cu") if p not in wanted]
    return stale + strays


def write_all() -> tuple[list[Path], list[Path]]:
    """Rewrite the files that changed and delete the strays; returns (rewritten, deleted)."""
    wanted = {entry.path: entry for entry in entries()}
    strays = [p for p in GENERATED.rglob("*.cu") if p not in wanted]
    for stray in strays:
        stray.unlink()
    return [path for path, entry in wanted.items() if write_if_changed(path, entry.source())], strays
