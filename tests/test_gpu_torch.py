"""codegen.torch on the GPU: the functional against F.conv2d/conv3d in both memory formats and each
precision, the output poisoned beforehand, PyTorch's current stream honoured, a CUDA graph capture
replayed, and torch.compile (fullgraph, and mode="reduce-overhead") running a swapped model."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from codegen import torch as convgen_torch  # noqa: E402

pytestmark = pytest.mark.gpu
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
"""L2 relative error against PyTorch at the same precision (TF32 off for float32)."""


@pytest.fixture(autouse=True)
def _no_tf32():
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous


def _relative(ours, theirs) -> float:
    assert not torch.isnan(ours).any()
    return float((ours.double() - theirs.double()).norm() / theirs.double().norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape", [(4, 17, 23, 19, 33, 3, 1, 1), (2, 3, 40, 36, 16, 7, 2, 3), (3, 24, 12, 12, 40, 1, 1, 0)])
def test_conv2d_matches_pytorch_in_its_memory_format(dtype, channels_last, shape):
    n, c, h, w, k, r, stride, padding = shape
    x = torch.randn(n, c, h, w, device="cuda", dtype=dtype)
    weight = torch.randn(k, c, r, r, device="cuda", dtype=dtype)
    bias = torch.randn(k, device="cuda", dtype=dtype)
    if channels_last:
        x, weight = x.contiguous(memory_format=torch.channels_last), weight.contiguous(memory_format=torch.channels_last)
    theirs = F.conv2d(x, weight, bias, stride, padding)
    ours = convgen_torch.conv(x, weight, bias, stride, padding)
    assert ours.shape == theirs.shape
    assert ours.is_contiguous(memory_format=torch.channels_last) if channels_last else ours.is_contiguous()
    assert _relative(ours, theirs) <= TOLERANCE[dtype]


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv3d_and_the_module_match_pytorch(channels_last):
    theirs = torch.nn.Conv3d(6, 10, 3, stride=(1, 2, 2), padding=1).cuda()
    ours = convgen_torch.Conv3d(6, 10, 3, stride=(1, 2, 2), padding=1).cuda()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 6, 5, 14, 15, device="cuda")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
        theirs, ours = (m.to(memory_format=torch.channels_last_3d) for m in (theirs, ours))
    with torch.no_grad():
        assert _relative(ours(x), theirs(x)) <= TOLERANCE[torch.float32]


def test_out_is_written_and_an_accepted_call_does_not_let_others_through():
    """A built kernel on a NaN-poisoned out= tensor; after a call has been accepted, arguments of
    another shape or dtype are still refused (the signature cache keys them)."""
    from codegen.api import LaunchError, build

    x = torch.randn(2, 8, 16, 16, device="cuda")
    weight = torch.randn(8, 8, 3, 3, device="cuda")
    spec, _ = convgen_torch.spec_for(x, weight, ((1, 1), (1, 1), (1, 1)))
    kernel = build("implicit_gemm", spec)
    out = torch.full((2, 8, 16, 16), float("nan"), device="cuda")
    kernel(x, weight, out=out)
    assert _relative(out, F.conv2d(x, weight, padding=1)) <= TOLERANCE[torch.float32]
    with pytest.raises(LaunchError, match="shape"):
        kernel(x[:, :4], weight)
    with pytest.raises(LaunchError, match="dtype"):
        kernel(x.half(), weight.half())


def test_the_current_stream_is_honoured():
    """Launched on a side stream that first waits on a long kernel: the result is only there after
    that stream is synchronised, never on the default stream before."""
    x = torch.randn(8, 32, 64, 64, device="cuda")
    weight = torch.randn(32, 32, 3, 3, device="cuda")
    expected = F.conv2d(x, weight, padding=1)
    convgen_torch.conv(x, weight, padding=1, math="fma")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        y = convgen_torch.conv(x, weight, padding=1, math="fma")
    assert not side.query()
    side.synchronize()
    assert _relative(y, expected) <= TOLERANCE[torch.float32]


CAPTURED = {  # (input shape, filters, dtype): the plain path, and split-K's workspace and reduction on sm_90
    "fp32": ((4, 16, 20, 20), 24, torch.float32),
    "bf16-split-k": ((1, 512, 7, 7), 512, torch.bfloat16),
}


@pytest.mark.parametrize("case", CAPTURED)
def test_a_captured_cuda_graph_replays_the_kernels(case):
    """Captured launches replay on new inputs, a split-K plan's workspace (PyTorch's caching
    allocator, the graph's private pool) and its reduction launch included."""
    shape, filters, dtype = CAPTURED[case]
    x = torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(filters, shape[1], 3, 3, device="cuda", dtype=dtype).contiguous(
        memory_format=torch.channels_last)
    static = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        convgen_torch.conv(static, weight, padding=1, math="fma")   # warm-up: load, check, cache
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = convgen_torch.conv(static, weight, padding=1, math="fma")
    for _ in range(2):
        fresh = torch.randn_like(x)
        static.copy_(fresh)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _relative(y, F.conv2d(fresh, weight, padding=1)) <= TOLERANCE[dtype]


def test_split_k_workspace_is_kept_per_stream_and_fresh_under_capture():
    """Calls on one stream share one workspace, grown when a call needs more; another stream gets
    its own, so that calls on both streams at once cannot overwrite each other's partial tiles; a
    captured call takes a fresh one from the graph's pool; clear_kernels gives them all back. Each
    output is checked against PyTorch."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("split-K's workspace: the WGMMA kernel, sm_90")
    from codegen import api
    from codegen.families.base import Buffer

    convgen_torch.clear_kernels()
    small, large = Buffer("partials", (2, 64, 64), "workspace"), Buffer("partials", (4, 64, 64), "workspace")
    kept, pointer = api._torch_workspace(small, 0)
    assert api._torch_workspace(small, 0)[1] == pointer and kept.numel() == 2 * 64 * 64 * 4
    grown, grown_pointer = api._torch_workspace(large, 0)
    assert grown.numel() == 4 * 64 * 64 * 4 and api._torch_workspace(small, 0)[1] == grown_pointer
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert api._torch_workspace(small, 0)[1] != grown_pointer
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = api._torch_workspace(small, 0)
    assert all(captured is not entry[0] for entry in api._STREAM_WORKSPACES.values())
    x = torch.randn(2, 1, 512, 7, 7, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(512, 512, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last)
    inputs = [xi.contiguous(memory_format=torch.channels_last) for xi in x]
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        on_side = convgen_torch.conv(inputs[0], weight, padding=1)
    on_main = convgen_torch.conv(inputs[1], weight, padding=1)
    torch.cuda.synchronize()
    for y, xi in ((on_side, inputs[0]), (on_main, inputs[1])):
        assert _relative(y, F.conv2d(xi, weight, padding=1)) <= TOLERANCE[torch.bfloat16]
    assert len(api._STREAM_WORKSPACES) == 2
    convgen_torch.clear_kernels()
    assert not api._STREAM_WORKSPACES


def test_three_tf32_split_k_takes_its_two_workspaces_apart():
    """A 3xTF32 split-K plan on the WGMMA kernel takes two workspaces (the split filter and the partial tiles): each
    kept per stream under its own name, so that neither overwrites the other. Checked against cuDNN's FP32."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("3xTF32's split filter: the WGMMA kernel, sm_90")
    from codegen import api

    convgen_torch.clear_kernels()
    x = torch.randn(1, 512, 7, 7, device="cuda").contiguous(memory_format=torch.channels_last)
    weight = torch.randn(512, 512, 3, 3, device="cuda").contiguous(memory_format=torch.channels_last)
    y = convgen_torch.conv(x, weight, padding=1, math="3xtf32")
    again = convgen_torch.conv(x, weight, padding=1, math="3xtf32")
    allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        expected = F.conv2d(x, weight, padding=1)
    finally:
        torch.backends.cudnn.allow_tf32 = allowed
    names = {key[2] for key in api._STREAM_WORKSPACES}
    assert names == {"w_split", "partials"}, names
    assert _relative(y, expected) <= 1e-5 and torch.equal(y, again)
    convgen_torch.clear_kernels()


def _example_network():
    sys.path.insert(0, str(Path(__file__).parent.parent / "scripts"))
    try:
        from torch_example import network
    finally:
        sys.path.pop(0)
    return network()


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_runs_a_swapped_model(mode):
    torch.manual_seed(0)
    theirs = _example_network().eval().cuda().to(memory_format=torch.channels_last)
    ours = _example_network().eval().cuda().to(memory_format=torch.channels_last)
    ours.load_state_dict(theirs.state_dict())
    convgen_torch.swap_convolutions(ours, math="fma")
    compiled = torch.compile(ours, fullgraph=True, mode=mode)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 64, 64, device="cuda").contiguous(memory_format=torch.channels_last)
            assert _relative(compiled(x), theirs(x)) <= 1e-4
