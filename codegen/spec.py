"""The convolution spec: what a kernel is specialised for, validated once at construction.

Nothing a user typed reaches a template without passing through here.  Every error names the
field, the value it got and what would have been accepted, so that a CLI user can fix the flag
without reading a traceback.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any


class SpecError(ValueError):
    """An invalid spec or tile choice; the message names the field, the value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str):
        self.field = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field_name}={value!r} is invalid: {allowed}")


class Layout(str, enum.Enum):
    NCHW = "NCHW"
    NHWC = "NHWC"
    NCDHW = "NCDHW"
    NDHWC = "NDHWC"

    @property
    def dims(self) -> int:
        return len(self.value) - 2

    @property
    def channels_last(self) -> bool:
        return self.value.endswith("C")


class DType(str, enum.Enum):
    """Element types of input, filter and output.  Whatever the type, sums accumulate in FP32 and
    round once to the output type at the end (as cuDNN and CUTLASS do)."""

    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"

    @property
    def c_type(self) -> str:
        return {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}[self.value]

    @property
    def itemsize(self) -> int:
        return 4 if self is DType.float32 else 2


    @property
    def short_name(self) -> str:
        return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.value]


DTYPE_ALIASES = {"fp32": DType.float32, "f32": DType.float32, "fp16": DType.float16, "f16": DType.float16,
                 "half": DType.float16, "bf16": DType.bfloat16}
"""Short names a user may type for a dtype (PyTorch's and CUTLASS's spellings)."""


class MathMode(str, enum.Enum):
    """How a float32 convolution multiplies (PyTorch's ``fp32_precision`` and cuDNN's math types):
    ``fma`` in full FP32 on the FMA pipe; ``tf32`` with operands rounded to TF32 on tensor cores
    (what ``torch.backends.cudnn.allow_tf32`` does); ``3xtf32`` with each operand split into a TF32
    big and small part and three tensor-core products, FP32-level accuracy (CUTLASS's "fast
    accurate FP32").  float16 and bfloat16 always multiply on tensor cores, so they take ``fma``,
    the field's default, meaning "no float32 mode"."""

    fma = "fma"
    tf32 = "tf32"
    three_tf32 = "3xtf32"

    @property
    def tensor_cores(self) -> bool:
        return self is not MathMode.fma


def uses_tensor_cores(dtype: "DType", math_mode: MathMode) -> bool:
    """Whether a spec of this dtype and math mode runs on tensor cores (sm_80 and newer)."""
    return dtype is not DType.float32 or math_mode.tensor_cores


def _dtype(value: Any) -> "DType":
    if isinstance(value, str) and value.lower() in DTYPE_ALIASES:
        return DTYPE_ALIASES[value.lower()]
    try:
        return DType(value)
    except ValueError:
        raise SpecError("dtype", value, f"must be one of {', '.join(d.value for d in DType)} "
                        f"(or {', '.join(DTYPE_ALIASES)})") from None


LAYOUTS_FOR_DIMS = {2: (Layout.NCHW, Layout.NHWC), 3: (Layout.NCDHW, Layout.NDHWC)}


SIZE_MAX = 2**31 - 1
"""The largest size, channel count, stride, padding or dilation: 32-bit, as in cuDNN's tensor and
convolution descriptors, so that the kernels' loop counters and per-axis coordinates fit an int."""
ELEMENTS_MAX = 2**61
"""The most elements a tensor may hold: its byte offsets (4 bytes an element) must fit a signed
64-bit integer, the widest index a kernel uses."""


def _integer(value: Any) -> int | None:
    """``value`` as a Python int where it is an integer (numpy's integer types included), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    number = _integer(value)
    if number is None or number < minimum:
        raise SpecError(name, value, f"must be an integer >= {minimum}")
    if number > SIZE_MAX:
        raise SpecError(name, value, f"must be at most {SIZE_MAX} (sizes are 32-bit, as in cuDNN's descriptors)")
    return number


def output_extents(input_size: tuple[int, ...], filter_size: tuple[int, ...], stride: tuple[int, ...],
                   padding: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    """The output size per axis, floor((in + 2p - d(f - 1) - 1) / s) + 1, as cuDNN and PyTorch give it."""
    return tuple((size + 2 * p - d * (f - 1) - 1) // s + 1
                 for size, f, s, p, d in zip(input_size, filter_size, stride, padding, dilation))


def _per_dim(name: str, value: Any, dims: int, minimum: int) -> tuple[int, ...]:
    """An int broadcasts to every spatial dimension; a sequence must have one entry per dimension."""
    if isinstance(value, (list, tuple)):
        if len(value) != dims:
            raise SpecError(name, value, f"needs {dims} entries (one per spatial dimension) or one integer")
        return tuple(_positive_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(value))
    return (_positive_int(name, value, minimum),) * dims


@dataclass(frozen=True)
class ConvSpec:
    """A convolution problem: shapes, layout, geometry and element type (the *what*, never the *how*).

    Spatial tuples run outermost first: (H, W) in 2D and (D, H, W) in 3D; likewise for the filter
    (R, S) / (T, R, S), stride, padding and dilation.  ``dpitch`` is the channel pitch of
    channels-last data in elements (the DECX padded depth); it defaults to ``c``.
    """

    dims: int
    layout: Layout
    n: int
    c: int
    k: int
    input_size: tuple[int, ...]
    filter_size: tuple[int, ...]
    stride: tuple[int, ...] = field(default=1)
    padding: tuple[int, ...] = field(default=0)
    dilation: tuple[int, ...] = field(default=1)
    dpitch: int | None = None
    dtype: DType = DType.float32
    math: MathMode = MathMode.fma

    def __post_init__(self) -> None:
        dims = _integer(self.dims)
        if dims not in (2, 3):
            raise SpecError("dims", self.dims, "must be 2 or 3")
        if not isinstance(self.layout, (str, Layout)):
            raise SpecError("layout", self.layout, f"must be one of {', '.join(l.value for l in Layout)}")
        if not isinstance(self.dtype, (str, DType)):
            raise SpecError("dtype", self.dtype, f"must be one of {', '.join(d.value for d in DType)}")
        if not isinstance(self.math, (str, MathMode)):
            raise SpecError("math", self.math, f"must be one of {', '.join(m.value for m in MathMode)}")
        try:
            layout = Layout(self.layout)
        except ValueError:
            raise SpecError("layout", self.layout, f"must be one of {', '.join(l.value for l in Layout)}") from None
        if layout not in LAYOUTS_FOR_DIMS[dims]:
            allowed = " or ".join(l.value for l in LAYOUTS_FOR_DIMS[dims])
            raise SpecError("layout", layout.value, f"a {dims}D spec takes {allowed}")
        dtype = _dtype(self.dtype)
        try:
            math_mode = MathMode(self.math)
        except ValueError:
            raise SpecError("math", self.math, f"must be one of {', '.join(m.value for m in MathMode)}") from None
        if math_mode is not MathMode.fma and dtype is not DType.float32:
            raise SpecError("math", math_mode.value, f"applies to float32 only; {dtype.value} always multiplies on "
                            "tensor cores, accumulating in FP32 (leave math at fma)")
        n, c, k = (_positive_int(name, getattr(self, name)) for name in ("n", "c", "k"))
        input_size = _per_dim("input_size", self.input_size, dims, 1)
        filter_size = _per_dim("filter_size", self.filter_size, dims, 1)
        stride = _per_dim("stride", self.stride, dims, 1)
        padding = _per_dim("padding", self.padding, dims, 0)
        dilation = _per_dim("dilation", self.dilation, dims, 1)
        dpitch = self.dpitch
        if dpitch is not None:
            if not layout.channels_last:
                raise SpecError("dpitch", dpitch, f"applies only to channels-last layouts; {layout.value} has none")
            dpitch = _positive_int("dpitch", dpitch)
            if dpitch < c:
                raise SpecError("dpitch", dpitch, f"must be >= c ({c})")
        for i, (size, f, p, d) in enumerate(zip(input_size, filter_size, padding, dilation)):
            extent = d * (f - 1) + 1
            if extent > size + 2 * p:
                axis = _axis_name(dims, i)
                raise SpecError(
                    "filter_size",
                    filter_size,
                    f"the dilated filter spans {extent} along {axis}, more than the padded input "
                    f"({size} + 2*{p} = {size + 2 * p}): the output would be empty",
                )
        _check_totals(n, c, k, dpitch or c, input_size, filter_size, stride, padding, dilation)
        for name, value in (
            ("dims", dims),
            ("n", n),
            ("c", c),
            ("k", k),
            ("dpitch", dpitch),
            ("layout", layout),
            ("dtype", dtype),
            ("math", math_mode),
            ("input_size", input_size),
            ("filter_size", filter_size),
            ("stride", stride),
            ("padding", padding),
            ("dilation", dilation),
        ):
            object.__setattr__(self, name, value)

    @property
    def pitch(self) -> int:
        """Elements between consecutive pixels of channels-last data (the channel pitch)."""
        return self.dpitch if self.dpitch is not None else self.c

    @property
    def output_size(self) -> tuple[int, ...]:
        return output_extents(self.input_size, self.filter_size, self.stride, self.padding, self.dilation)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["layout"] = self.layout.value
        data["dtype"] = self.dtype.value
        data["math"] = self.math.value
        for key in ("input_size", "filter_size", "stride", "padding", "dilation"):
            data[key] = list(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ConvSpec":
        if not isinstance(data, dict):
            raise SpecError("spec", data, "must be a mapping of spec fields (a dict or a JSON object)")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise SpecError(unknown[0], data[unknown[0]], f"unknown field; the fields are {', '.join(sorted(known))}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in data and f.default is dataclasses.MISSING]
        if missing:
            raise SpecError(missing[0], None, "the field is required")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str) -> "ConvSpec":
        if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"from_json's path must be a file path (str or os.PathLike); got {type(path).__name__}")
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except OSError as err:
            raise SpecError("spec", path, f"could not be read ({err.strerror})") from None
        except json.JSONDecodeError as err:
            raise SpecError("spec", path, f"is not valid JSON ({err.msg} at line {err.lineno})") from None
        except UnicodeDecodeError as err:
            raise SpecError("spec", path, f"is not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x})") from None
        if not isinstance(data, dict):
            raise SpecError("spec", path, "must hold a JSON object of spec fields")
        return cls.from_dict(data)

    def describe(self) -> str:
        """One line for headers, tables and error reports."""
        pitch = f" dpitch={self.dpitch}" if self.dpitch is not None else ""
        math = f" math={self.math.value}" if self.math is not MathMode.fma else ""
        return (
            f"{self.dims}D {self.layout.value} n={self.n} c={self.c} k={self.k} "
            f"input={'x'.join(map(str, self.input_size))} filter={'x'.join(map(str, self.filter_size))} "
            f"stride={_tup(self.stride)} padding={_tup(self.padding)} dilation={_tup(self.dilation)}"
            f"{pitch} {self.dtype.value}{math}"
        )


def _check_totals(n: int, c: int, k: int, pitch: int, input_size: tuple[int, ...], filter_size: tuple[int, ...],
                  stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...]) -> None:
    """Refuse a spec whose tensors could not be addressed with 64-bit byte offsets, whose reduction
    (C x taps) a 32-bit loop counter could not count, or whose padded extent along an axis passes
    32 bits (the kernels' per-axis coordinates, o*s - p + k*d, stay within it), naming the field
    that drives it."""
    for j, (size, p) in enumerate(zip(input_size, padding)):
        if size + 2 * p > SIZE_MAX:
            raise SpecError(f"padding[{j}]" if 2 * p > size else f"input_size[{j}]", p if 2 * p > size else size,
                            f"makes the padded extent {size} + 2*{p} pass {SIZE_MAX} (coordinates are 32-bit)")
    taps = math.prod(filter_size)
    if taps > SIZE_MAX:
        raise SpecError("filter_size", filter_size, f"has {taps} taps; at most {SIZE_MAX} (the kernels count taps "
                        "in 32 bits, as cuDNN does)")
    if c * taps > SIZE_MAX:
        raise SpecError("c", c, f"makes the reduction C x taps = {c} x {taps} = {c * taps}; at most {SIZE_MAX} "
                        "(the kernels count it in 32 bits, as cuDNN does)")
    output = output_extents(input_size, filter_size, stride, padding, dilation)
    channels = "dpitch" if pitch != c else "c"
    tensors = (("input", n * math.prod(input_size) * pitch, {"n": n, "input_size": input_size, channels: pitch}),
               ("output", n * k * math.prod(output), {"n": n, "k": k, "input_size": input_size}),
               ("filter", k * c * taps, {"k": k, "c": c, "filter_size": filter_size}))
    for tensor, elements, fields in tensors:
        if elements > ELEMENTS_MAX:
            name = max(fields, key=lambda f: math.prod(fields[f]) if isinstance(fields[f], tuple) else fields[f])
            raise SpecError(name, fields[name], f"makes the {tensor} tensor {elements:.3g} elements, more than the "
                            "2^61 whose byte offsets fit 64 bits")


def _tup(values: tuple[int, ...]) -> str:
    return ",".join(map(str, values))


def _axis_name(dims: int, i: int) -> str:
    return ("D", "H", "W")[i + 3 - dims]


def replace(spec: ConvSpec, **changes: Any) -> ConvSpec:
    """A copy of ``spec`` with ``changes`` applied and validated again."""
    data = spec.to_dict()
    data.update(changes)
    return ConvSpec.from_dict(data)
