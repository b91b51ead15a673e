"""The benchmark layers: the package's shapes.json, or a ``--shapes`` file of its form, each layer
checked field by field, and each made a ``ConvSpec`` in the layout asked for.

``convgen bench``, ``convgen tune --layer`` and the catalogue in generated/ take their layers here.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from codegen.spec import ConvSpec, SpecError

BATCH = 128
"""The batch ``bench im2col`` and ``bench col2im`` run the twelve layers at, and the catalogue's files
for them (and for a layer of shapes.json that gives no N)."""


def load_shapes() -> dict:
    return json.loads(resources.files("codegen").joinpath("shapes.json").read_text())


LAYER_SIZES = {2: ("N", "C", "H", "W", "K", "R", "S"), 3: ("N", "C", "D", "H", "W", "K", "T", "R", "S")}
LAYER_GEOMETRY = {"stride": 1, "padding": 0, "dilation": 1}
"""A layer's stride, padding and dilation, with PyTorch's defaults where a --shapes file leaves one out."""


def benchmark_layers(groups: tuple[str, ...], path: Path | None = None) -> list[dict]:
    """The layers a benchmark runs, each tagged with its group: those of ``groups`` in the
    package's shapes.json, or every layer of a ``--shapes`` file (``read_shapes_file``)."""
    if path is not None:
        return read_shapes_file(path)
    shapes = load_shapes()
    return [dict(layer, group=group) for group in groups for layer in shapes[group]]


def read_shapes_file(path: Path) -> list[dict]:
    """Every layer of a file of the package's shapes.json form: an object of lists of layers (other
    values, such as a note, are skipped), or a bare list of layers.  Each layer is checked field by
    field and then as a spec, so a typo is named with its layer before any GPU work."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError("--shapes", str(path), "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecError("--shapes", str(path), f"must be a readable JSON file ({err})") from None
    groups = {"layers": data} if isinstance(data, list) else (
        {group: value for group, value in data.items() if isinstance(value, list)} if isinstance(data, dict) else {})
    layers = [dict(_checked_layer(layer, Path(path).name, f"{group}[{i}]"), group=group)
              for group, entries in groups.items() for i, layer in enumerate(entries)]
    if not layers:
        raise SpecError("--shapes", str(path), "holds no layers: give a list of layers, or an object of such lists "
                        "as codegen/shapes.json does")
    names = [layer["name"] for layer in layers]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated:
        raise SpecError(f"{Path(path).name}: name", repeated, "names a layer twice; each layer needs its own name")
    return layers


def _checked_layer(layer, source: str, position: str) -> dict:
    """``layer`` with its geometry as one value per dimension, or a SpecError that names the file
    (``source``) and the layer: by its name where it has one, else by ``position``."""
    if not isinstance(layer, dict):
        raise SpecError(f"{source}: {position}", layer, "a layer is an object, e.g. {\"name\": \"res2a\", \"N\": 32, "
                        "\"C\": 64, ...}")
    name = layer.get("name")
    where = f"{source}: {name if isinstance(name, str) and name else position}"
    dims = 3 if "D" in layer or "T" in layer else 2
    sizes = LAYER_SIZES[dims]
    allowed = ("name", *sizes, *LAYER_GEOMETRY)
    unknown = [key for key in layer if key not in allowed]
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", layer[unknown[0]], f"not a field of a {dims}D layer; those are "
                        f"{', '.join(allowed)}")
    for key in ("name", *sizes):
        if key not in layer:
            raise SpecError(f"{where}.{key}", None, f"missing; a {dims}D layer gives name, {', '.join(sizes)}")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name", name, "must be a non-empty string")
    for key in sizes:
        if isinstance(layer[key], bool) or not isinstance(layer[key], int) or layer[key] < 1:
            raise SpecError(f"{where}.{key}", layer[key], "must be a whole number >= 1")
    checked = {key: layer[key] for key in ("name", *sizes)}
    for key, default in LAYER_GEOMETRY.items():
        value = layer.get(key, default)
        values = [value] * dims if isinstance(value, int) and not isinstance(value, bool) else value
        if (not isinstance(values, list) or len(values) != dims
                or any(isinstance(v, bool) or not isinstance(v, int) for v in values)):
            raise SpecError(f"{where}.{key}", value, f"must be one whole number or a list of {dims}, one per "
                            "spatial dimension, outermost first")
        checked[key] = values
    try:
        layer_spec(checked, "NCDHW" if dims == 3 else "NCHW", checked["N"])
    except SpecError as err:
        raise SpecError(f"{where}: {err.field}", err.value, err.allowed) from None
    return checked


def layer_spec(layer: dict, layout: str, n: int) -> ConvSpec:
    dims = 3 if "D" in layer else 2
    sizes = (layer["D"], layer["H"], layer["W"]) if dims == 3 else (layer["H"], layer["W"])
    filters = (layer["T"], layer["R"], layer["S"]) if dims == 3 else (layer["R"], layer["S"])
    return ConvSpec(dims=dims, layout=layout, n=n, c=layer["C"], k=layer["K"], input_size=sizes,
                    filter_size=filters, stride=tuple(layer["stride"]), padding=tuple(layer["padding"]),
                    dilation=tuple(layer["dilation"]))


def select_layers(shapes: list[dict], layers) -> list[dict]:
    """The layers named in ``layers`` (all when empty), refusing names the benchmark does not have."""
    if not layers:
        return shapes
    known = [l["name"] for l in shapes]
    unknown = [name for name in layers if name not in known]
    if unknown:
        raise SpecError("--layers", unknown[0], f"must be among {', '.join(known)}")
    return [l for l in shapes if l["name"] in layers]
