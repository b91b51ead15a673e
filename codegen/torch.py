"""convgen from PyTorch: a functional ``conv``, ``Conv2d``/``Conv3d`` modules, ``swap_convolutions``
for a whole model, and the custom op ``torch.ops.convgen.conv`` that ``torch.compile`` and CUDA
graphs see.

PyTorch stays optional: ``import codegen`` never imports it, and this module says how to install
it where it is missing.  Tensors keep their memory format: a contiguous (NCHW / NCDHW) input runs
the channels-first kernel, a ``channels_last`` one the channels-last kernel, and the output comes
back in the input's format, as cuDNN does through PyTorch.  Precision follows PyTorch: float16
and bfloat16 tensors run the tensor-core kernel in their type, and float32 runs TF32 where
PyTorch's cuDNN convolutions would (``torch.backends.cudnn.allow_tf32``, on by default), FP32
FMA otherwise, unless ``math`` says which.

Kernels are built once per (shapes, strides, dtypes, devices, 16-byte alignment residues,
geometry, math mode, family, tiles, grad mode, deterministic flag) and kept in this process; a
call with arguments seen before goes from a dictionary lookup to the launch.  In eager mode the
functional launches directly (the custom op's dispatch costs more host time than the kernel on
small layers); under ``torch.compile`` it calls the custom op, whose fake implementation gives the
output's shape and strides without a GPU.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

try:
    import torch
    from torch import nn
except ImportError as missing:   # PyTorch is optional for the rest of convgen
    raise ImportError("codegen.torch needs PyTorch: pip install torch (see https://pytorch.org/get-started/ for "
                      "the build that matches your CUDA); the rest of convgen runs without it") from missing

from codegen.api import Kernel, build, plan, release_workspaces
from codegen.families import get_family
from codegen.spec import ConvSpec, SpecError, output_extents
from codegen.tiles import Tiles

__all__ = ["conv", "Conv2d", "Conv3d", "swap_convolutions", "SwapReport", "clear_kernels", "check_only", "op_config"]

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}
TO_CHANNELS_LAST = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
"""(N, C, spatial) views of channels_last tensors as the (N, spatial, C) buffers the kernels take."""
FROM_CHANNELS_LAST = {4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)}
KEYED_ALIGNMENT = 16
"""The address residue a call's key holds: a kernel whose buffers need more alignment is never
launched from the key alone (none does: 16 bytes is what TMA and 16-byte copies need)."""
MAX_KERNELS = 256
"""Kernels kept per process; past this the cache starts over (a model has tens of layers)."""

_kernels: dict[tuple, tuple[Kernel, torch.Size, tuple[int, ...], int]] = {}
"""Per call key: the kernel, its output's shape and strides (the input's memory format), and the
CUDA device index."""
_built: dict[tuple, Kernel] = {}
"""Per (spec, family, tiles, device): the kernel, shared by the call keys that differ in nothing it
depends on (an address's residue, a size-1 axis's stride), so that each loads its module once."""
_check_only: dict = {}
"""Set inside ``check_only``: the target kernels are built for, and what was built."""


@contextlib.contextmanager
def check_only(target: str = "h100") -> Iterator[list]:
    """Within this block ``conv`` (and so the modules) plans, renders and compiles the kernel each
    call would launch, for ``target`` (a card name as ``--target`` takes, or a ``Device``), and
    returns PyTorch's own result: a model runs through on a machine without a GPU, on CPU tensors,
    and every kernel it needs is shown to build.  Yields the list of (spec, kernel) built."""
    built: list = []
    _check_only.update(target=target, built=built, seen={})
    try:
        yield built
    finally:
        _check_only.clear()


def clear_kernels() -> None:
    """Forget the process's kernels (they rebuild from the compile cache on their next call) and
    give the workspaces kept per stream back to PyTorch's caching allocator."""
    _kernels.clear()
    _built.clear()
    release_workspaces()


def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: int | Sequence[int] = 1,
         padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1, *,
         math: str | None = None, family: str = "implicit_gemm", tiles: Tiles | dict | None = None) -> torch.Tensor:
    """``F.conv2d`` / ``F.conv3d`` (by ``x.dim()``) on a convgen kernel: the same arguments, the
    output in ``x``'s memory format.  ``math`` (float32 only): ``fma``, ``tf32`` or ``3xtf32``;
    None follows ``torch.backends.cudnn.allow_tf32``.  ``family`` and ``tiles`` pick the kernel as
    ``codegen.build`` does (None: the tuned record, else the heuristic).  ``bias`` is added by
    PyTorch after the kernel (fused epilogues are not built yet)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input must be a torch.Tensor; got {type(x).__name__}")
    dims = x.dim() - 2
    geometry = (_per_axis("stride", stride, dims), _per_axis("padding", padding, dims),
                _per_axis("dilation", dilation, dims))
    if _check_only:
        _build_only(x, weight, geometry, groups, _math_mode(math, x), family, tiles)
        functional = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv3d
        return functional(x, weight, bias, *geometry, groups)
    if torch.compiler.is_compiling():
        _refuse_grad(x, weight)     # the compiled forward calls the op with grad off, past _run's own refusal
        y = torch.ops.convgen.conv(x, weight, op_config(geometry, groups, _math_mode(math, x), family, tiles))
    else:
        y = _run(x, weight, geometry, groups, _math_mode(math, x), family, tiles)
    if bias is not None:
        y = y + bias.view(1, -1, *([1] * dims))
    return y


def _run(x, weight, geometry: tuple, groups: int, math_mode: str, family: str, tiles) -> torch.Tensor:
    """The eager path.  First sight of these arguments (shapes, strides, dtypes, devices, 16-byte
    alignment residues, geometry, precision, kernel choice): checked in full, the kernel built and
    called through ``Kernel.__call__``'s checks.  After that: an output of the first call's shape
    and strides, and the launch on the three addresses, which is what keeps the host time of a
    call near PyTorch's own."""
    x_pointer, weight_pointer = x.data_ptr(), weight.data_ptr()
    key = _call_key(x, weight, x_pointer, weight_pointer, geometry, groups, math_mode, family, tiles)
    found = _kernels.get(key)
    if found is not None:
        kernel, shape, strides, device_index = found
        y = x.new_empty_strided(shape, strides)
        kernel.launch_tensors([x_pointer, weight_pointer, y.data_ptr()], device_index)
        return y
    kernel, channels_last = _kernel_for(x, weight, geometry, groups, math_mode, family, tiles)
    dims = x.dim()
    if channels_last:
        y = kernel(x.permute(*TO_CHANNELS_LAST[dims]), weight.permute(*TO_CHANNELS_LAST[dims]))
        y = y.permute(*FROM_CHANNELS_LAST[dims])
    else:
        y = kernel(x, weight)
    if max(b.alignment for b in kernel.plan.buffers) <= KEYED_ALIGNMENT:
        if len(_kernels) >= MAX_KERNELS:
            _kernels.clear()
        _kernels[key] = (kernel, y.shape, y.stride(), x.get_device())
    return y


def _call_key(x, weight, x_pointer: int, weight_pointer: int, geometry: tuple, groups: int, math_mode: str,
              family: str, tiles) -> tuple:
    """What a kept kernel is found by: everything that changes the kernel, its checks or its launch."""
    return (x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, weight.dtype, x.device, weight.device,
            x_pointer % KEYED_ALIGNMENT, weight_pointer % KEYED_ALIGNMENT, geometry, groups, math_mode, family,
            _tiles_key(tiles), torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad),
            torch.are_deterministic_algorithms_enabled())


def _kernel_for(x, weight, geometry: tuple, groups: int, math_mode: str, family: str, tiles) -> tuple[Kernel, bool]:
    """Check the arguments as a user would want them named, then build the kernel."""
    spec, channels_last = spec_for(x, weight, geometry, groups, math_mode)
    key = (spec, family, _tiles_key(tiles), x.get_device(), torch.are_deterministic_algorithms_enabled())
    kernel = _built.get(key)
    if kernel is None:
        with torch.cuda.device(x.device):
            kernel = build(family, spec, _deterministic(family, spec, _as_tiles(tiles)))
        if len(_built) >= MAX_KERNELS:
            _built.clear()
        _built[key] = kernel
    return kernel, channels_last


def _build_only(x, weight, geometry: tuple, groups: int, math_mode: str, family: str, tiles) -> None:
    """``check_only``'s work for one call: the kernel built for its target, once per spec."""
    spec, _ = spec_for(x, weight, geometry, groups, math_mode, on_gpu=False)
    key = (spec, family, _tiles_key(tiles))
    if key not in _check_only["seen"]:
        target = _check_only["target"]
        kernel = build(family, spec, _deterministic(family, spec, _as_tiles(tiles), target), target=target)
        _check_only["seen"][key] = kernel
        _check_only["built"].append((spec, kernel))


def _deterministic(family: str, spec: ConvSpec, tiles, target=None):
    """``tiles``, or under ``torch.use_deterministic_algorithms`` where none are given and the
    chosen plan sums with atomic adds (``KernelPlan.atomic_sums``: the FP32 kernels' split-K, the
    TMA kernel's stream-K tail), tiles that do not: the chosen ones unsplit, or for the TMA kernel
    the portable kernel's, unsplit. Atomic adds sum in an order that varies from run to run, and
    PyTorch asks every library for run-to-run identical results there (as cuDNN then leaves out its
    nondeterministic algorithms). The WGMMA kernel's split-K adds its ranges in a fixed order."""
    if tiles is not None or not torch.are_deterministic_algorithms_enabled():
        return tiles
    chosen = plan(family, spec, target=target)
    if not chosen.atomic_sums:
        return None
    fields = chosen.tiles.to_dict()
    if fields.get("tma"):
        fields = get_family(family).for_spec(spec).default_tiles(spec, device=target).to_dict()
    return {**fields, "split_k": 1}


def spec_for(x, weight, geometry: tuple, groups: int = 1, math_mode: str = "fma",
             on_gpu: bool = True) -> tuple[ConvSpec, bool]:
    """The ``ConvSpec`` of a convolution of these tensors (stride, padding, dilation per axis), and
    whether it is channels-last; refuses what no kernel runs, naming the argument."""
    channels_last = _check_arguments(x, weight, groups, on_gpu)
    stride, padding, dilation = geometry
    layout = {(4, False): "NCHW", (4, True): "NHWC", (5, False): "NCDHW", (5, True): "NDHWC"}[(x.dim(), channels_last)]
    spec = ConvSpec(dims=x.dim() - 2, layout=layout, n=x.shape[0], c=x.shape[1], k=weight.shape[0],
                    input_size=tuple(x.shape[2:]), filter_size=tuple(weight.shape[2:]), stride=stride,
                    padding=padding, dilation=dilation, dtype=DTYPES.get(x.dtype, str(x.dtype)),
                    math=math_mode if x.dtype == torch.float32 else "fma")
    return spec, channels_last


def _check_arguments(x, weight, groups: int, on_gpu: bool = True) -> bool:
    """Whether ``x`` is channels-last, after refusing what no kernel runs, naming the argument."""
    for name, tensor in (("input", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(tensor).__name__}")
        if on_gpu and not tensor.is_cuda:
            raise SpecError(name, str(tensor.device), "must be on a CUDA device (convgen's kernels run on the GPU)")
        if tensor.dtype not in DTYPES:
            raise SpecError(f"{name}.dtype", str(tensor.dtype), "must be torch.float32, torch.float16 or torch.bfloat16")
    if x.dim() not in (4, 5):
        raise SpecError("input", tuple(x.shape), "must be 4-D (N, C, H, W) or 5-D (N, C, D, H, W)")
    if weight.dim() != x.dim():
        raise SpecError("weight", tuple(weight.shape), f"must be {x.dim()}-D like the input (K, C, filter sizes)")
    if weight.device != x.device or weight.dtype != x.dtype:
        raise SpecError("weight", f"{weight.dtype} on {weight.device}", f"must match the input ({x.dtype} on {x.device})")
    if groups != 1:
        raise SpecError("groups", groups, "must be 1: grouped and depthwise convolution are not built yet")
    if weight.shape[1] != x.shape[1]:
        raise SpecError("weight", tuple(weight.shape), f"must have the input's {x.shape[1]} channels in dim 1")
    _refuse_grad(x, weight)
    channels_last = _is_channels_last(x)
    if not (channels_last or x.is_contiguous()):
        raise SpecError("input", f"strides {x.stride()}", "must be contiguous or channels_last: call .contiguous() or "
                        f".contiguous(memory_format={'torch.channels_last' if x.dim() == 4 else 'torch.channels_last_3d'})")
    wanted = CHANNELS_LAST[x.dim()] if channels_last else torch.contiguous_format
    if not weight.is_contiguous(memory_format=wanted):
        raise SpecError("weight", f"strides {weight.stride()}", f"must be in the input's memory format ({wanted}): "
                        "convert it once with .contiguous(memory_format=...), not per call")
    return channels_last


def _refuse_grad(x, weight) -> None:
    """No backward exists yet: a call that autograd would record is refused, never run without one
    (the op has no autograd kernel, so gradients would silently stay None)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        raise SpecError("requires_grad", True, "convgen has no backward yet: run inference under torch.no_grad() or "
                        "torch.inference_mode(), or call model.requires_grad_(False)")


def _per_axis(name: str, value, dims: int) -> tuple[int, ...]:
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        return (value,) * dims
    if isinstance(value, (tuple, list)) and len(value) == dims and all([isinstance(v, int) for v in value]):
        return tuple(value)
    raise SpecError(name, value, f"must be an int or {dims} ints (one per spatial axis)"
                    + (" ('same'/'valid' strings: use Conv2d/Conv3d or give the numbers)" if isinstance(value, str) else ""))


def _math_mode(math: str | None, x) -> str:
    """The math mode of a float32 call: ``math``, else PyTorch's own choice for cuDNN convolutions."""
    if math is not None:
        return math
    if getattr(x, "dtype", None) != torch.float32:
        return "fma"
    return "tf32" if torch.backends.cudnn.allow_tf32 else "fma"


def _tiles_key(tiles) -> str:
    """Tiles as the custom op passes them (a string: ops take no dicts), and as cache keys."""
    if tiles is None:
        return ""
    if isinstance(tiles, str):
        return tiles
    fields = tiles.to_dict() if isinstance(tiles, Tiles) else dict(tiles)
    return ",".join(f"{k}={v}" for k, v in sorted(fields.items()))


def _as_tiles(tiles) -> Tiles | dict | None:
    if isinstance(tiles, str):
        return _tiles_from_key(tiles)
    return tiles


def _tiles_from_key(key: str) -> dict | None:
    if not key:
        return None
    parsed = {}
    for item in key.split(","):
        name, value = item.split("=", 1)
        parsed[name] = {"True": True, "False": False}.get(value, int(value) if value.lstrip("-").isdigit() else value)
    return parsed


_LIBRARY = torch.library.Library("convgen", "DEF")
"""The op is defined and implemented through ``torch.library.Library`` rather than
``torch.library.custom_op``: the dispatcher then calls the implementation directly, where
custom_op's wrapper (autograd redispatch, the aliasing check of every output) cost 4 times the host
time a call (4.5 against 20 us a call on the CPU machine, docs/perf-history.md, Torch v3)."""
_LIBRARY.define("conv(Tensor x, Tensor weight, str config) -> Tensor")
"""Everything but the tensors travels as one string (``op_config``): the dispatcher converts each
argument of a Python op for the call, and one string cost 1.8 us a call against 4.1 for the seven
of stride, padding, dilation, groups, math, family and tiles (a stub op on the CPU machine,
docs/perf-history.md, Torch v4). A string, unlike a registry index, stays valid in another
process (an exported or cached graph)."""
OP_CONFIG_FIELDS = ("stride", "padding", "dilation", "groups", "math", "family", "tiles")


def op_config(geometry: tuple, groups: int, math_mode: str, family: str, tiles) -> str:
    """The custom op's ``config``: ``stride=2,2;padding=1,1;dilation=1,1;groups=1;math=tf32;
    family=implicit_gemm;tiles=`` (tiles as ``name=value`` pairs joined by commas, empty for the
    tuned record or the heuristic)."""
    stride, padding, dilation = (",".join(map(str, axis)) for axis in geometry)
    return (f"stride={stride};padding={padding};dilation={dilation};groups={groups};math={math_mode};"
            f"family={family};tiles={_tiles_key(tiles)}")


@functools.lru_cache(maxsize=MAX_KERNELS)
def _parse_op_config(config: str) -> tuple[tuple, int, str, str, str]:
    """(geometry, groups, math, family, tiles key) of an ``op_config`` string, parsed once per string."""
    try:
        fields = dict(item.split("=", 1) for item in config.split(";"))
        if tuple(fields) != OP_CONFIG_FIELDS:
            raise ValueError
        geometry = tuple(tuple(int(v) for v in fields[name].split(",")) for name in OP_CONFIG_FIELDS[:3])
        if len({len(axis) for axis in geometry}) != 1 or len(geometry[0]) not in (2, 3):
            raise ValueError
        return geometry, int(fields["groups"]), fields["math"], fields["family"], fields["tiles"]
    except ValueError:
        raise SpecError("config", config, "must be as codegen.torch.op_config writes it: "
                        f"{op_config(((1, 1), (0, 0), (1, 1)), 1, 'fma', 'implicit_gemm', None)}") from None


def _conv_op(x: torch.Tensor, weight: torch.Tensor, config: str) -> torch.Tensor:
    """The convolution as one op for torch.compile: the eager path on real tensors (every backend,
    so that a CPU tensor gets ``_run``'s refusal rather than the dispatcher's)."""
    geometry, groups, math_mode, family, tiles = _parse_op_config(config)
    return _run(x, weight, geometry, groups, math_mode, family, tiles or None)


_LIBRARY.impl("conv", _conv_op, "CompositeExplicitAutograd")


@torch.library.register_fake("convgen::conv", lib=_LIBRARY)
def _conv_fake(x, weight, config):
    """The output's shape and memory format, as ``_run`` makes them, from shapes alone."""
    (stride, padding, dilation), *_ = _parse_op_config(config)
    if len(stride) != x.dim() - 2:
        raise SpecError("config", config, f"must give stride, padding and dilation for each of the input's "
                        f"{x.dim() - 2} spatial axes")
    sizes = output_extents(tuple(x.shape[2:]), tuple(weight.shape[2:]), stride, padding, dilation)
    memory_format = CHANNELS_LAST[x.dim()] if _is_channels_last(x) else torch.contiguous_format
    return torch.empty((x.shape[0], weight.shape[0], *sizes), dtype=x.dtype, device=x.device,
                       memory_format=memory_format)


def _is_channels_last(x) -> bool:
    """Whether ``x`` runs the channels-last kernel: channels_last and not also contiguous (where
    both hold, C = 1 or a 1x1 image, the channels-first kernel reads the same bytes)."""
    return not x.is_contiguous() and x.is_contiguous(memory_format=CHANNELS_LAST[x.dim()])


class _ConvMixin:
    """What Conv2d and Conv3d share: PyTorch's module, its parameters and state_dict, with the
    convolution on a convgen kernel.  ``padding='same'`` becomes numbers at construction."""

    def _convgen_init(self, math: str | None, family: str, tiles) -> None:
        if self.groups != 1:
            raise SpecError("groups", self.groups, "must be 1: grouped and depthwise convolution are not built yet")
        if self.padding_mode != "zeros":
            raise SpecError("padding_mode", self.padding_mode, "must be 'zeros' (the kernels pad with zeros)")
        self.padding = _numeric_padding(self.padding, self.kernel_size, self.dilation)
        self.convgen_math, self.convgen_family, self.convgen_tiles = math, family, tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                    math=self.convgen_math, family=self.convgen_family, tiles=self.convgen_tiles)


    def _get_name(self) -> str:
        return f"convgen.{type(self).__name__}"


class Conv2d(_ConvMixin, nn.Conv2d):
    """``torch.nn.Conv2d`` (same arguments, parameters and state_dict) on a convgen kernel; plus
    ``math``, ``family`` and ``tiles`` as ``conv`` takes them."""

    def __init__(self, *args: Any, math: str | None = None, family: str = "implicit_gemm", tiles=None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._convgen_init(math, family, tiles)


class Conv3d(_ConvMixin, nn.Conv3d):
    """``torch.nn.Conv3d`` on a convgen kernel, as ``Conv2d``."""

    def __init__(self, *args: Any, math: str | None = None, family: str = "implicit_gemm", tiles=None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._convgen_init(math, family, tiles)


def _numeric_padding(padding, kernel_size: tuple[int, ...], dilation: tuple[int, ...]) -> tuple[int, ...]:
    """``padding`` as numbers: 'valid' is 0, 'same' half the dilated filter where that is symmetric."""
    if padding == "valid":
        return (0,) * len(kernel_size)
    if padding == "same":
        spans = [d * (k - 1) for k, d in zip(kernel_size, dilation)]
        if any(span % 2 for span in spans):
            raise SpecError("padding", "same", f"needs a symmetric padding, and a dilated filter span of {spans} pads "
                            "one side more than the other; give the padding as numbers")
        return tuple(span // 2 for span in spans)
    return tuple(padding)


@dataclasses.dataclass
class SwapReport:
    """What ``swap_convolutions`` did: the modules it replaced, and those it left with the reason."""

    swapped: list[str] = dataclasses.field(default_factory=list)
    left: dict[str, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"convgen: {len(self.swapped)} convolution(s) swapped, {len(self.left)} left"]
        lines += [f"  left {name}: {why}" for name, why in self.left.items()]
        return "\n".join(lines)


def swap_convolutions(model: nn.Module, *, math: str | None = None, family: str = "implicit_gemm") -> SwapReport:
    """Replace every ``nn.Conv2d`` / ``nn.Conv3d`` of ``model`` that a convgen kernel runs, in place,
    keeping its parameters (the same tensors); the report names the rest and why."""
    report = SwapReport()
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) not in (nn.Conv2d, nn.Conv3d):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            why = _ineligible(child)
            if why:
                report.left[name] = why
                continue
            cls = Conv2d if isinstance(child, nn.Conv2d) else Conv3d
            swapped = cls.__new__(cls)
            swapped.__dict__.update(child.__dict__)
            swapped._convgen_init(math, family, None)
            setattr(parent, child_name, swapped)
            report.swapped.append(name)
    return report


def _ineligible(module: nn.Module) -> str | None:
    if module.groups != 1:
        return f"groups={module.groups}: grouped and depthwise convolution are not built yet"
    if module.padding_mode != "zeros":
        return f"padding_mode={module.padding_mode!r}: the kernels pad with zeros"
    try:
        _numeric_padding(module.padding, module.kernel_size, module.dilation)
    except SpecError as err:
        return str(err)
    return None
