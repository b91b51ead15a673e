"""The catalogue in generated/: standalone files for the benchmark layers, kept fresh by a test.

Each entry is emitted with batch 128 (the benchmark's) for both 2D layouts, so a project can take
the file for its layer and build it with plain nvcc.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codegen.bench import BATCH, layer_spec, load_shapes
from codegen.emit import emit_source, write_if_changed
from codegen.spec import ConvSpec

GENERATED = Path(__file__).resolve().parent.parent / "generated"
FAMILY_TILES = {"im2col": (None,), "col2im": ({"algorithm": "gather"}, {"algorithm": "scatter"})}


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
    found = []
    for layer in load_shapes()["conv2d_mec"]:
        for layout in ("NCHW", "NHWC"):
            spec = layer_spec(layer, layout, BATCH)
            for family, tile_options in FAMILY_TILES.items():
                for tiles in tile_options:
                    suffix = f"_{tiles['algorithm']}" if tiles else ""
                    found.append(Entry(family, f"{layer['name']}_{layout.lower()}{suffix}", spec, tiles))
    return found


def stale_files() -> list[Path]:
    """Catalogue files that are missing or differ from what the generator renders now, plus strays."""
    wanted = {entry.path: entry for entry in entries()}
    stale = [path for path, entry in wanted.items() if not path.exists() or path.read_text() != entry.source()]
    strays = [p for p in GENERATED.rglob("*.cu") if p not in wanted]
    return stale + strays


def write_all() -> list[Path]:
    wanted = {entry.path: entry for entry in entries()}
    for stray in [p for p in GENERATED.rglob("*.cu") if p not in wanted]:
        stray.unlink()
    return [path for path, entry in wanted.items() if write_if_changed(path, entry.source())]
