"""codegen.torch without a GPU: the custom op's fake implementation, tracing a whole model into one
graph, the modules and the swap, the refusals, and check-only builds.  Skipped where PyTorch is
not installed (it is optional); ``import codegen`` never needs it."""
import contextlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from codegen import torch as convgen_torch  # noqa: E402
from codegen.spec import ConvSpec, SpecError  # noqa: E402

SCRIPTS = Path(__file__).parent.parent / "scripts"


def test_import_codegen_needs_no_torch():
    """A blocked ``import torch`` leaves ``import codegen`` and a build working, and codegen.torch
    says how to install PyTorch."""
    code = ("import sys; sys.modules['torch'] = None\n"
            "import codegen, codegen.api, codegen.cli\n"
            "try:\n    import codegen.torch\nexcept ImportError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install torch" in done.stdout


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_fake_conv_gives_the_shape_and_memory_format_of_the_real_one(dims, channels_last):
    size = (9, 11, 13)[:dims]
    x = torch.empty(2, 5, *size, device="meta")
    w = torch.empty(7, 5, *(3,) * dims, device="meta")
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}[dims]
    if channels_last:
        x, w = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
    config = convgen_torch.op_config(((2,) * dims, (1,) * dims, (1,) * dims), 1, "fma", "implicit_gemm", None)
    y = torch.ops.convgen.conv(x, w, config)
    expected = torch.nn.functional.conv2d if dims == 2 else torch.nn.functional.conv3d
    reference = expected(x, w, stride=2, padding=1)
    assert y.shape == reference.shape
    assert y.is_contiguous(memory_format=fmt) if channels_last else y.is_contiguous()


def test_deterministic_algorithms_leave_out_the_tma_kernels_stream_k_tail(cache_dir):
    """A 256-channel 28x28 float32 layer runs the TMA kernel with a stream-K tail on the H100, its
    shared tiles summed with atomic adds; under torch.use_deterministic_algorithms it builds a
    kernel without atomic sums (the portable one, unsplit)."""
    plans = _plans_without_and_with_determinism(256, 28, 32, "fma")
    assert plans[0].variant == "tma" and plans[0].atomic_sums
    assert plans[1].variant != "tma" and not plans[1].atomic_sums and plans[1].tiles.split_k == 1


def test_op_config_round_trips_and_a_malformed_one_is_refused_by_name():
    geometry = ((2, 1, 1), (0, 1, 2), (1, 1, 3))
    tiles = {"wgmma": True, "block_n": 128, "split_k": 4}
    config = convgen_torch.op_config(geometry, 1, "tf32", "implicit_gemm", tiles)
    assert config == ("stride=2,1,1;padding=0,1,2;dilation=1,1,3;groups=1;math=tf32;family=implicit_gemm;"
                      "tiles=block_n=128,split_k=4,wgmma=True")
    assert convgen_torch._parse_op_config(config) == (geometry, 1, "tf32", "implicit_gemm",
                                                      "block_n=128,split_k=4,wgmma=True")
    assert convgen_torch._tiles_from_key(convgen_torch._parse_op_config(config)[4]) == tiles
    x, w = torch.empty(1, 4, 8, 8, device="meta"), torch.empty(4, 4, 3, 3, device="meta")
    for malformed in ("stride=1,1", config.replace("groups=1", "groups=one"), config.replace(";math", ";mode"),
                      config.replace("stride=2,1,1", "stride=2,1")):
        with pytest.raises(SpecError) as error:
            torch.ops.convgen.conv(x, w, malformed)
        assert error.value.field == "config" and "stride=1,1;padding=0,0" in error.value.allowed
    with pytest.raises(SpecError) as error:      # a 3-D config on a 2-D input
        torch.ops.convgen.conv(x, w, config)
    assert error.value.field == "config" and "2 spatial axes" in error.value.allowed


def _example_network():
    sys.path.insert(0, str(SCRIPTS))
    try:
        from torch_example import network
    finally:
        sys.path.pop(0)
    return network()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_swapped_model_traces_into_one_graph_with_no_break(backend):
    """torch.compile(fullgraph=True) on meta tensors: every convolution is the custom op, and the
    fake implementation carries the channels_last format through the network."""
    model = _example_network().eval()
    report = convgen_torch.swap_convolutions(model)
    assert len(report.swapped) == 15 and not report.left
    model = model.to("meta", memory_format=torch.channels_last)
    x = torch.empty(2, 3, 32, 32, device="meta").contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(x)
        y = torch.compile(model, fullgraph=True, backend=backend)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    ops = [n for g in explained.graphs for n in g.graph.nodes if "convgen" in str(n.target)]
    assert len(ops) == 15
    assert y.shape == (2, 256, 4, 4) and y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_model_that_needs_gradients_is_refused(backend):
    """Compiled, the forward calls the op with grad off: without the refusal at trace time the
    weights' gradients would silently stay None (the op has no backward)."""
    model = convgen_torch.Conv2d(3, 8, 3, padding=1).to("meta")
    x = torch.empty(2, 3, 16, 16, device="meta")
    with pytest.raises(Exception, match="no backward yet"):
        torch.compile(model, fullgraph=True, backend=backend)(x)


@pytest.mark.parametrize("math, splits", [("fma", [16, 1]), ("tf32", [16, 16])])
def test_deterministic_algorithms_leave_out_atomic_split_k_alone(math, splits, cache_dir):
    """A batch-1 512-channel layer splits K 16 ways on the H100. The FP32 FMA kernel adds its ranges
    with atomic adds in a varying order, so under torch.use_deterministic_algorithms the same call
    builds it unsplit; the WGMMA kernel (TF32) adds them in a fixed order and keeps its split."""
    assert [p.tiles.split_k for p in _plans_without_and_with_determinism(512, 7, 1, math)] == splits


def _plans_without_and_with_determinism(channels: int, size: int, batch: int, math: str) -> list:
    """The plans a channels-last 3x3 layer builds for the H100, without and then with
    torch.use_deterministic_algorithms."""
    model = convgen_torch.Conv2d(channels, channels, 3, padding=1, math=math).to(memory_format=torch.channels_last)
    x = torch.empty(batch, channels, size, size).contiguous(memory_format=torch.channels_last)
    plans = []
    for deterministic in (False, True):
        torch.use_deterministic_algorithms(deterministic)
        try:
            with torch.no_grad(), convgen_torch.check_only("h100") as built:
                model(x)
        finally:
            torch.use_deterministic_algorithms(False)
        plans.append(built[0][1].plan)
    return plans


def test_swap_keeps_parameters_and_names_what_it_leaves():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding="same"), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2),
                          nn.Conv3d(2, 2, 2), nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"),
                          nn.Conv2d(8, 8, 2, padding="same"))
    weight = model[0].weight
    report = convgen_torch.swap_convolutions(model)
    assert report.swapped == ["0", "3"]
    assert set(report.left) == {"2", "4", "5"}
    assert "groups=2" in report.left["2"] and "reflect" in report.left["4"] and "same" in report.left["5"]
    assert isinstance(model[0], convgen_torch.Conv2d) and model[0].weight is weight
    assert model[0].padding == (1, 1) and isinstance(model[3], convgen_torch.Conv3d)
    assert "convgen.Conv2d" in repr(model) and "2 convolution(s) swapped, 3 left" in str(report)


def test_modules_take_torch_arguments_and_state_dicts():
    theirs = nn.Conv3d(4, 6, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), bias=True)
    ours = convgen_torch.Conv3d(4, 6, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1), bias=True, math="fma")
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    with pytest.raises(SpecError, match="groups"):
        convgen_torch.Conv2d(4, 8, 3, groups=2)
    with pytest.raises(SpecError, match="padding_mode"):
        convgen_torch.Conv2d(4, 8, 3, padding_mode="circular")


def _refusal(x, w, **kwargs):
    with pytest.raises((SpecError, TypeError)) as caught:
        convgen_torch.spec_for(x, w, ((1, 1), (0, 0), (1, 1)), **kwargs)
    return str(caught.value)


def test_bad_tensors_are_refused_naming_the_argument():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    assert "CUDA" in _refusal(x, w) and "input" in _refusal(x, w)
    assert "float64" in _refusal(x.double(), w.double(), on_gpu=False)
    assert "groups" in _refusal(x, w, groups=2, on_gpu=False)
    assert "4 channels" in _refusal(x, torch.randn(6, 5, 3, 3), on_gpu=False)
    assert "contiguous or channels_last" in _refusal(x[:, :, ::2], w, on_gpu=False)
    assert "memory format" in _refusal(x.contiguous(memory_format=torch.channels_last), w, on_gpu=False)
    assert "must match the input" in _refusal(x, w.half(), on_gpu=False)
    with torch.enable_grad():
        assert "no backward" in _refusal(x, w.requires_grad_(), on_gpu=False)
    with pytest.raises(SpecError, match="stride"):
        convgen_torch.conv(x, w, stride=(1, 2, 3))
    with pytest.raises(TypeError, match="torch.Tensor"):
        convgen_torch.conv(x.numpy(), w)


def test_specs_follow_the_memory_format_and_pytorchs_tf32_setting():
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    spec, channels_last = convgen_torch.spec_for(x, w, ((2, 2), (1, 1), (1, 1)), on_gpu=False)
    assert (spec.layout.value, spec.stride, channels_last) == ("NCHW", (2, 2), False)
    last = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    spec, channels_last = convgen_torch.spec_for(*last, ((1, 1), (0, 0), (1, 1)), on_gpu=False)
    assert (spec.layout.value, channels_last) == ("NHWC", True)
    previous = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = True
        assert convgen_torch._math_mode(None, x) == "tf32"
        torch.backends.cudnn.allow_tf32 = False
        assert convgen_torch._math_mode(None, x) == "fma"
        assert convgen_torch._math_mode(None, x.bfloat16()) == "fma"
    finally:
        torch.backends.cudnn.allow_tf32 = previous


def test_check_only_builds_every_kernel_a_model_launches(cache_dir):
    """The example network in check-only mode on the CPU: each distinct layer's kernel is built
    (planned, rendered, compiled) for the H100, and the outputs are PyTorch's."""
    model = _example_network().eval()
    convgen_torch.swap_convolutions(model, math="fma")
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), convgen_torch.check_only("h100") as built:
        y = model(x)
    assert len(built) == 8 and y.shape == (2, 256, 4, 4)
    assert all(kernel.compiled.cubin for _, kernel in built)
    assert {spec.layout.value for spec, _ in built} == {"NCHW"}



def test_a_kernel_call_with_any_argument_changed_goes_back_to_the_full_checks(monkeypatch):
    """``Kernel.__call__`` on tensors skips the checks only for a signature checked before: a
    changed shape, dtype, device, contiguity or address residue is checked again (CPU and meta
    tensors stand in for CUDA ones; the checks and the launch are recorded, not run)."""
    from codegen.api import Kernel, plan

    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=32, k=32, input_size=(16, 16), filter_size=(3, 3), padding=1)
    kernel = Kernel(plan("implicit_gemm", spec, {"tma": True}, target="h100"), None, SimpleNamespace(cubin=b""))
    checked, launched = [], []
    monkeypatch.setattr(Kernel, "_check_torch", lambda self, inputs, out: checked.append(out))
    monkeypatch.setattr(Kernel, "launch_tensors", lambda self, pointers, device_index: launched.append(pointers))
    x_buffer, w_buffer = kernel.plan.inputs
    assert x_buffer.alignment == 16
    x, w, y = (torch.empty(b.shape) for b in (x_buffer, w_buffer, kernel.plan.output))
    kernel(x, w, out=y)
    kernel(x, w, out=y)
    assert len(checked) == 1 and launched[1] == [x.data_ptr(), w.data_ptr(), y.data_ptr()]
    misaligned = torch.empty(x.numel() + 1)[1:].view(x.shape)
    transposed = torch.empty_strided(y.shape, tuple(reversed(y.stride())))
    changes = ((x[:1], w, y), (x.double(), w, y), (x, w.to("meta"), y), (misaligned, w, y), (x, w, transposed))
    for count, (x_changed, w_changed, y_changed) in enumerate(changes, start=2):
        kernel(x_changed, w_changed, out=y_changed)
        assert len(checked) == count


class _StandInKernel:
    """What ``codegen.torch`` needs of a kernel, with nothing launched."""

    plan = SimpleNamespace(buffers=[SimpleNamespace(alignment=4)])

    def __call__(self, x, weight):
        return torch.empty(x.shape[0], weight.shape[0], *x.shape[2:])

    def launch_tensors(self, pointers, device_index):
        pass


def test_the_functionals_key_holds_the_weights_dtype_and_device(monkeypatch):
    """A weight of another dtype or device than the call a kernel was kept for misses that kernel
    and goes back to the checks and the build."""
    built = []

    def build_stand_in(x, weight, geometry, groups, math_mode, family, tiles):
        built.append((weight.dtype, weight.device.type))
        return _StandInKernel(), False

    monkeypatch.setattr(convgen_torch, "_kernel_for", build_stand_in)
    convgen_torch.clear_kernels()
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    try:
        for weight in (w, w, w.half(), w.to("meta"), w):
            convgen_torch.conv(x, weight, padding=1, math="fma")
    finally:
        convgen_torch.clear_kernels()
    assert built == [(torch.float32, "cpu"), (torch.float16, "cpu"), (torch.float32, "meta")]


class _ChannelsLastStandIn(_StandInKernel):
    """A channels-last kernel's stand-in: called on permuted (N, spatial, C) views, it returns its
    output as the kernel does, (N, spatial, K) contiguous, for ``_run`` to permute back."""

    def __call__(self, x, weight):
        return torch.empty(x.shape[0], *x.shape[1:-1], weight.shape[0])


@pytest.mark.parametrize("dims", [2, 3])
def test_a_kept_kernel_allocates_its_output_in_the_first_calls_memory_format(monkeypatch, dims):
    """The second call skips the build and allocates from the first call's shape and strides: the
    output stays channels_last (channels_last_3d) as the first one was."""
    monkeypatch.setattr(convgen_torch, "_kernel_for", lambda *args: (_ChannelsLastStandIn(), True))
    fmt = {2: torch.channels_last, 3: torch.channels_last_3d}[dims]
    x = torch.randn(2, 4, *(6,) * dims).contiguous(memory_format=fmt)
    w = torch.randn(5, 4, *(3,) * dims).contiguous(memory_format=fmt)
    convgen_torch.clear_kernels()
    try:
        first, second = (convgen_torch.conv(x, w, padding=1, math="fma") for _ in range(2))
    finally:
        convgen_torch.clear_kernels()
    assert first.is_contiguous(memory_format=fmt) and not first.is_contiguous()
    assert second.shape == first.shape and second.stride() == first.stride()


def test_call_keys_that_differ_only_in_an_address_residue_share_one_kernel(monkeypatch):
    """Two calls whose inputs differ only in their addresses' 16-byte residue are two call keys (the
    alignment checks run again) but one spec: the second reuses the first's kernel and module."""
    built = []
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=4, k=6, input_size=(8, 8), filter_size=3, padding=1)
    monkeypatch.setattr(convgen_torch, "spec_for", lambda *args, **kwargs: (spec, False))
    monkeypatch.setattr(convgen_torch, "build", lambda *args, **kwargs: built.append(args) or _StandInKernel())
    monkeypatch.setattr(convgen_torch.torch.cuda, "device", lambda device: contextlib.nullcontext())
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    shifted = torch.empty(x.numel() + 1)[1:].view(x.shape).copy_(x)
    convgen_torch.clear_kernels()
    try:
        for x_call in (x, shifted, x):
            convgen_torch.conv(x_call, w, padding=1, math="fma")
        assert len(convgen_torch._kernels) == 2 and len(built) == 1
    finally:
        convgen_torch.clear_kernels()
