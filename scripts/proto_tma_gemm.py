"""Prototype for issue 4 (not part of the package): implicit-GEMM convolution, channels-last, fed by
Hopper's tensor memory accelerator in warp-specialised persistent blocks (docs/perf.md, GEMM v11).

For every k-slice (one filter tap, BK = 32 channels) one thread issues two TMA copies: the A tile in
*im2col mode* (BM consecutive output pixels' input pixels at that tap: the hardware walks rows and
images, applies the stride and writes zeros for padding) into [BM][32] rows under the 128-byte
swizzle, and the B tile in tiled mode.  Both complete on the stage's "full" mbarrier; consumer warps
wait on it, multiply 8x8 outputs per thread (A read as float4 along k: four k-steps of eight rows)
and release the stage; after a tile's last slice they store straight from registers.  So the
consumers issue only shared loads, FFMAs and one XOR per row group and k-chunk (the swizzle).

Configurations are BMxBNxSTAGES with flags: ``t`` reads B as [k][n] from a filter transposed per
call to taps x C x K (each accumulator then meets a B register of one parity; with B as float4 along
k too, 47 % of the FFMAs had two same-bank operands), ``i`` drops the producer warp (the last warp
to release a stage refills it), ``bN`` asks for N blocks per SM.

Usage (repo root, sm_90 GPU, PyTorch for the peers and the float64 check):

    PYTHONPATH=$PWD python3 scripts/proto_tma_gemm.py            # correctness shapes, then the layers
    CONFIGS=128x128x4t,256x64x4t PYTHONPATH=$PWD python3 scripts/proto_tma_gemm.py checks conv8 conv4
    CONFIGS=128x128x4t ncu ... python3 scripts/proto_tma_gemm.py profile conv8   # one launch, for ncu
"""
import math
import os
import sys

from codegen import index
from codegen import tma as package_tma
from codegen.families.base import TensorMap
from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec

BK = 32
HELPERS = ('{% import "common/async_copy.cu.j2" as copy_helpers %}'
           '{{ copy_helpers.barrier_helpers() }}\n{{ copy_helpers.tensor_helpers(3) }}\n')
"""The package's mbarrier and tensor-map helpers (the B copy is a 3-D tiled box), rendered once."""
SOURCE = r'''
#define RANK {rank}
#define BM {bm}
#define BN {bn}
#define BK 32
#define STAGES {stages}
#define WARPS_M {warps_m}
#define WARPS_N {warps_n}
#define CONSUMERS (WARPS_M * WARPS_N)
#define GEMM_M {gemm_m}
#define GEMM_N {gemm_n}
#define N_TILES {n_tiles}
#define TILES {tiles}
#define C_CHUNKS {c_chunks}
#define SLICES {slices}
#define A_STAGE (BM * BK)
#define B_STAGE (BN * BK)
#define INLINE_PRODUCER {inline}
#define TRANSPOSED_B {tb}
#define BLOCKS_PER_SM {blocks}
// Issue slice `i` of this block's sequence (tile i / SLICES of the block, k-slice i % SLICES) into stage s.
__device__ __forceinline__ void issue(const convgen_tensor_map* a_map, const convgen_tensor_map* b_map, float* a_tiles, float* b_tiles,
                                      unsigned long long* full, int i)
{{
    const int s = i % STAGES;
    const int tile = blockIdx.x + (i / SLICES) * gridDim.x, k = i % SLICES;
    const int m_tile = (tile / N_TILES) * BM, n_tile = (tile % N_TILES) * BN;
    int t = m_tile;
    const int ow = t % {ow}; t /= {ow};
    const int oh = t % {oh}; t /= {oh};
#if RANK == 5
    const int od = t % {od}; t /= {od};
#endif
    const int nb = t;
    const int tap = k / C_CHUNKS, c0 = (k % C_CHUNKS) * BK;
    const unsigned short kw = (tap % {fs}) * {dw};
    const unsigned short kh = ((tap / {fs}) % {fr}) * {dh};
    convgen_barrier_expect(&full[s], (A_STAGE + B_STAGE) * 4);
#if RANK == 5
    const unsigned short kd = (tap / ({fs} * {fr})) * {dd};
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {{%3, %4, %5, %6, %7}}], [%2], {{%8, %9, %10}};"
        :: "r"(convgen_shared(a_tiles + s * A_STAGE)), "l"(a_map), "r"(convgen_shared(&full[s])), "r"(c0), "r"(ow * {sw} - {pw}),
           "r"(oh * {sh} - {ph}), "r"(od * {sd} - {pd}), "r"(nb), "h"(kw), "h"(kh), "h"(kd) : "memory");
#else
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {{%3, %4, %5, %6}}], [%2], {{%7, %8}};"
        :: "r"(convgen_shared(a_tiles + s * A_STAGE)), "l"(a_map), "r"(convgen_shared(&full[s])), "r"(c0), "r"(ow * {sw} - {pw}),
           "r"(oh * {sh} - {ph}), "r"(nb), "h"(kw), "h"(kh) : "memory");
#endif
#if TRANSPOSED_B
    convgen_tensor_copy(b_tiles + s * B_STAGE, b_map, &full[s], n_tile, c0, tap);
#else
    convgen_tensor_copy(b_tiles + s * B_STAGE, b_map, &full[s], c0, tap, n_tile);
#endif
}}

extern "C" __global__ void __launch_bounds__(CONSUMERS * 32 + (INLINE_PRODUCER ? 0 : 32), BLOCKS_PER_SM)
conv_tma(const __grid_constant__ convgen_tensor_map a_map, const __grid_constant__ convgen_tensor_map b_map, float* __restrict__ y)
{{
    extern __shared__ __align__(1024) unsigned char raw[];
    // 128-byte swizzled tiles need 1024-byte aligned buffers.
    unsigned char* base = raw + ((1024 - (convgen_shared(raw) & 1023)) & 1023);
    float* const a_tiles = reinterpret_cast<float*>(base);
    float* const b_tiles = a_tiles + STAGES * A_STAGE;
    unsigned long long* const full = reinterpret_cast<unsigned long long*>(b_tiles + STAGES * B_STAGE);
    unsigned long long* const empty = full + STAGES;
    unsigned* const released = reinterpret_cast<unsigned*>(empty + STAGES);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (tid == 0) {{
        for (int s = 0; s < STAGES; ++s) {{ convgen_barrier_init(&full[s], 1); convgen_barrier_init(&empty[s], CONSUMERS); released[s] = 0; }}
        convgen_barrier_init_fence();
    }}
    __syncthreads();
    const int total = ((TILES - 1 - (int)blockIdx.x) / (int)gridDim.x + 1) * SLICES;   // slices of this block
#if INLINE_PRODUCER
    // No producer warp: thread 0 fills every stage first; afterwards the last warp to release a
    // stage refills it, so no warp waits for another except on data.
    if (tid == 0)
        for (int j = 0; j < STAGES && j < total; ++j) issue(&a_map, &b_map, a_tiles, b_tiles, full, j);
#else
    if (warp == CONSUMERS) {{
        if (lane != 0) return;
        for (int j = 0; j < total; ++j) {{
            convgen_barrier_wait(&empty[j % STAGES], ((j / STAGES) & 1) ^ 1);
            issue(&a_map, &b_map, a_tiles, b_tiles, full, j);
        }}
        return;
    }}
#endif
    const int lane_m = lane / 8, lane_n = lane % 8;
    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    // A rows m = warp_m*32 + lane_m + 4i (chunk kc of row r at kc ^ (r & 7) under the 128-byte
    // swizzle: lane_m | 4*(i&1)).
#if TRANSPOSED_B
    // B is [k][n] (filter pre-transposed to taps x C x K): this thread's channels are
    // warp_n*64 + lane_n*4 + 32*jj + (0..3), so each accumulator always meets a B register of one
    // parity (no register-bank conflict forced by the k loop), and stores are float4.
    const unsigned b_col0 = (warp_n * 64 + lane_n * 4) * 4;
#else
    const unsigned b_row0 = (warp_n * 64 + lane_n) * BK * 4;
#endif
    const unsigned a_row0 = (warp_m * 32 + lane_m) * BK * 4;
    float acc[8][8];
    int i = 0;
    for (int tile = blockIdx.x; tile < TILES; tile += gridDim.x) {{
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;
        for (int k = 0; k < SLICES; ++k, ++i) {{
            const int s = i % STAGES;
            convgen_barrier_wait(&full[s], (i / STAGES) & 1);
            const unsigned char* a_stage = reinterpret_cast<const unsigned char*>(a_tiles + s * A_STAGE) + a_row0;
#if TRANSPOSED_B
            const unsigned char* b_stage = reinterpret_cast<const unsigned char*>(b_tiles + s * B_STAGE) + b_col0;
#else
            const unsigned char* b_stage = reinterpret_cast<const unsigned char*>(b_tiles + s * B_STAGE) + b_row0;
#endif
#pragma unroll
            for (int kc = 0; kc < BK / 4; ++kc) {{
                const unsigned a_even = (unsigned)(kc ^ lane_m) << 4, a_odd = a_even ^ 64u;
                float4 av[8];
#pragma unroll
                for (int r = 0; r < 8; ++r)
                    av[r] = *reinterpret_cast<const float4*>(a_stage + r * 4 * BK * 4 + ((r & 1) ? a_odd : a_even));
#if TRANSPOSED_B
                float4 bq[4][2];
#pragma unroll
                for (int q = 0; q < 4; ++q)
#pragma unroll
                    for (int jj = 0; jj < 2; ++jj)
                        bq[q][jj] = *reinterpret_cast<const float4*>(b_stage + (kc * 4 + q) * BN * 4 + jj * 128);
#else
                const unsigned b_off = (unsigned)(kc ^ lane_n) << 4;
                float4 bv[8];
#pragma unroll
                for (int c = 0; c < 8; ++c)
                    bv[c] = *reinterpret_cast<const float4*>(b_stage + c * 8 * BK * 4 + b_off);
#endif
#pragma unroll
                for (int q = 0; q < 4; ++q) {{
#pragma unroll
                    for (int r = 0; r < 8; ++r) {{
                        const float a = q == 0 ? av[r].x : q == 1 ? av[r].y : q == 2 ? av[r].z : av[r].w;
#pragma unroll
                        for (int cc = 0; cc < 8; ++cc) {{
                            const int c = (r & 1) ? 7 - cc : cc;
#if TRANSPOSED_B
                            const float4 v = bq[q][c / 4];
                            const float b = c % 4 == 0 ? v.x : c % 4 == 1 ? v.y : c % 4 == 2 ? v.z : v.w;
#else
                            const float b = q == 0 ? bv[c].x : q == 1 ? bv[c].y : q == 2 ? bv[c].z : bv[c].w;
#endif
                            acc[r][c] = fmaf(a, b, acc[r][c]);
                        }}
                    }}
                }}
            }}
            __syncwarp();
#if INLINE_PRODUCER
            if (lane == 0 && atomicAdd(&released[s], 1u) == CONSUMERS - 1) {{
                released[s] = 0;
                if (i + STAGES < total) issue(&a_map, &b_map, a_tiles, b_tiles, full, i + STAGES);
            }}
#else
            if (lane == 0) convgen_barrier_arrive(&empty[s]);
#endif
        }}
        const int m_tile = (tile / N_TILES) * BM, n_tile = (tile % N_TILES) * BN;
#pragma unroll
        for (int r = 0; r < 8; ++r) {{
            const int m = m_tile + warp_m * 32 + lane_m + 4 * r;
            if (m >= GEMM_M) continue;
#if TRANSPOSED_B
#pragma unroll
            for (int jj = 0; jj < 2; ++jj) {{
                const int n = n_tile + warp_n * 64 + lane_n * 4 + 32 * jj;
                if (n < GEMM_N)
                    *reinterpret_cast<float4*>(y + (long long)m * GEMM_N + n) = make_float4(acc[r][4 * jj], acc[r][4 * jj + 1], acc[r][4 * jj + 2], acc[r][4 * jj + 3]);
            }}
#else
#pragma unroll
            for (int c = 0; c < 8; ++c) {{
                const int n = n_tile + warp_n * 64 + lane_n + 8 * c;
                if (n < GEMM_N) y[(long long)m * GEMM_N + n] = acc[r][c];
            }}
#endif
        }}
    }}
}}
'''

LAYERS = {
    "conv8": dict(n=128, c=64, size=(112, 112), k=128, f=(3, 3), stride=(1, 1), pad=(0, 0), dil=(1, 1)),
    "conv4": dict(n=128, c=64, size=(224, 224), k=64, f=(7, 7), stride=(2, 2), pad=(0, 0), dil=(1, 1)),
    "c3d_conv2": dict(n=8, c=64, size=(16, 56, 56), k=128, f=(3, 3, 3), stride=(1, 1, 1), pad=(1, 1, 1), dil=(1, 1, 1)),
    "conv9": dict(n=128, c=64, size=(56, 56), k=64, f=(3, 3), stride=(1, 1), pad=(0, 0), dil=(1, 1)),
}
CHECKS = {
    "asym2d": dict(n=3, c=40, size=(13, 17), k=24, f=(3, 5), stride=(2, 1), pad=(1, 2), dil=(1, 2)),
    "asym3d": dict(n=2, c=36, size=(5, 7, 9), k=40, f=(2, 3, 3), stride=(1, 2, 1), pad=(0, 1, 1), dil=(2, 1, 1)),
    "tiny": dict(n=1, c=32, size=(3, 4), k=8, f=(1, 1), stride=(1, 1), pad=(0, 0), dil=(1, 1)),
}


def out_size(g):
    return tuple((i + 2 * p - d * (f - 1) - 1) // s + 1 for i, p, d, f, s in zip(g["size"], g["pad"], g["dil"], g["f"], g["stride"]))


def spec_of(g, channels_last=True):
    three = len(g["size"]) == 3
    layout = ("NDHWC" if three else "NHWC") if channels_last else ("NCDHW" if three else "NCHW")
    return ConvSpec(dims=len(g["size"]), layout=layout, n=g["n"], c=g["c"], k=g["k"], input_size=g["size"],
                    filter_size=g["f"], stride=g["stride"], padding=g["pad"], dilation=g["dil"])


def encode_im2col(ptr, g, bm):
    """The package's im2col map of the image (``index.im2col_map_terms``), BK channels of bm pixels."""
    terms = index.im2col_map_terms(IndexAlgebra(spec_of(g)))
    return package_tma.encode(TensorMap("x", terms["dims"], terms["strides"], (BK, bm), swizzle=128,
                                        corners=(terms["lower"], terms["upper"]),
                                        element_strides=terms["element_strides"]), ptr)


def encode_filter(ptr, g, bn, transposed=False):
    """The filter as C x taps x K boxes of BK x 1 x bn under the 128-byte swizzle, or transposed to
    taps x C x K (``index.transposed_filter_terms``) in boxes of bn x BK x 1."""
    if transposed:
        terms = index.transposed_filter_terms(IndexAlgebra(spec_of(g)))
        return package_tma.encode(TensorMap("wt", terms["dims"], terms["byte_strides"], (bn, BK, 1)), ptr)
    taps = math.prod(g["f"])
    return package_tma.encode(TensorMap("w", (g["c"], taps, g["k"]), (4 * g["c"], 4 * g["c"] * taps), (BK, 1, bn),
                                        swizzle=128), ptr)


def helpers():
    from codegen.render import environment

    return environment().from_string(HELPERS).render()


def build(g, bm, bn, stages, inline=False, transposed=False, blocks=1):
    import cupy

    osz = out_size(g)
    gemm_m = g["n"] * math.prod(osz)
    warps_n, warps_m = bn // 64, bm // 32
    consumers = warps_m * warps_n
    n_tiles = -(-g["k"] // bn)
    tiles = -(-gemm_m // bm) * n_tiles
    c_chunks = -(-g["c"] // BK)
    three = len(osz) == 3
    f = g["f"] if three else (1, *g["f"])
    st = g["stride"] if three else (1, *g["stride"])
    pd = g["pad"] if three else (0, *g["pad"])
    dl = g["dil"] if three else (1, *g["dil"])
    o = osz if three else (1, *osz)
    code = helpers() + SOURCE.format(blocks=blocks, tb=int(transposed), inline=int(inline), rank=5 if three else 4, bm=bm, bn=bn, stages=stages, warps_m=warps_m, warps_n=warps_n,
                         gemm_m=gemm_m, gemm_n=g["k"], n_tiles=n_tiles, tiles=tiles, c_chunks=c_chunks,
                         slices=math.prod(f) * c_chunks, od=o[0], oh=o[1], ow=o[2], fr=f[1], fs=f[2],
                         sd=st[0], sh=st[1], sw=st[2], pd=pd[0], ph=pd[1], pw=pd[2], dd=dl[0], dh=dl[1], dw=dl[2])
    module = cupy.RawModule(code=code, options=("-arch=sm_90", "-std=c++17"))
    kernel = module.get_function("conv_tma")
    shared = 1024 + stages * (bm + bn) * BK * 4 + 20 * stages
    kernel.max_dynamic_shared_size_bytes = shared
    grid = min(tiles, 132 * blocks)

    def run(x, w, y, maps):
        kernel((grid,), (consumers * 32 + (0 if inline else 32),), (maps[0], maps[1], y), shared_mem=shared)

    return run, gemm_m, osz


def transposed_filter(g, w):
    """The filter as taps x C x K (K innermost), made per call in the timed path."""
    import cupy

    taps = math.prod(g["f"])
    return cupy.ascontiguousarray(w.reshape(g["k"], taps, g["c"]).transpose(1, 2, 0))


def refresh(g, w, wt):
    import cupy

    cupy.copyto(wt, w.reshape(g["k"], math.prod(g["f"]), g["c"]).transpose(1, 2, 0))


def torch_conv(g, x, w):
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    three = len(g["size"]) == 3
    perm = (0, 4, 1, 2, 3) if three else (0, 3, 1, 2)
    xt = torch.as_tensor(x, device="cuda").permute(*perm)
    wt = torch.as_tensor(w, device="cuda").permute(*perm)
    conv = F.conv3d if three else F.conv2d
    return lambda: conv(xt, wt, stride=g["stride"], padding=g["pad"], dilation=g["dil"]), xt, wt


def check(name, g, configs):
    import cupy
    import torch

    x = cupy.random.uniform(-1, 1, (g["n"], *g["size"], g["c"]), dtype=cupy.float32)
    w = cupy.random.uniform(-1, 1, (g["k"], *g["f"], g["c"]), dtype=cupy.float32)
    _, xt, wt = torch_conv(g, x, w)
    three = len(g["size"]) == 3
    conv = torch.nn.functional.conv3d if three else torch.nn.functional.conv2d
    ref = conv(xt.double(), wt.double(), stride=g["stride"], padding=g["pad"], dilation=g["dil"])
    ref = ref.permute(0, 2, 3, 4, 1) if three else ref.permute(0, 2, 3, 1)
    for bm, bn, stages, inline, transposed, blocks in configs:
        run, gemm_m, osz = build(g, bm, bn, stages, inline, transposed, blocks)
        y = cupy.full((g["n"], *osz, g["k"]), cupy.nan, dtype=cupy.float32)
        wt = transposed_filter(g, w) if transposed else w
        maps = (encode_im2col(x.data.ptr, g, bm), encode_filter(wt.data.ptr, g, bn, transposed))
        run(x, w, y, maps)
        cupy.cuda.runtime.deviceSynchronize()
        got = torch.as_tensor(y, device="cuda").double()
        err = (torch.linalg.norm(got - ref) / torch.linalg.norm(ref)).item()
        nans = int(torch.isnan(got).sum().item())
        print(f"check {name:8s} {bm}x{bn}x{stages}{'i' if inline else ''}{'t' if transposed else ''}: rel err {err:.2e}, NaN left {nans}", flush=True)


def bench(name, g, configs):
    import cupy
    import torch

    from codegen.api import build as package_build
    from codegen.bench import median_seconds

    x = cupy.random.uniform(-1, 1, (g["n"], *g["size"], g["c"]), dtype=cupy.float32)
    w = cupy.random.uniform(-1, 1, (g["k"], *g["f"], g["c"]), dtype=cupy.float32)
    osz = out_size(g)
    flops = 2 * g["n"] * math.prod(osz) * g["k"] * g["c"] * math.prod(g["f"])
    cudnn_nhwc, xt, wt = torch_conv(g, x, w)
    ref = cudnn_nhwc()
    three = len(g["size"]) == 3
    ref_nhwc = ref.permute(0, 2, 3, 4, 1) if three else ref.permute(0, 2, 3, 1)
    xc, wc = xt.contiguous(), wt.contiguous()
    conv = torch.nn.functional.conv3d if three else torch.nn.functional.conv2d
    cudnn_nchw = lambda: conv(xc, wc, stride=g["stride"], padding=g["pad"], dilation=g["dil"])
    rows = []

    def record(label, fn, seconds=None):
        seconds = median_seconds(fn, 7) if seconds is None else seconds
        rows.append((label, seconds * 1e3, flops / seconds / 1e12))

    record("cuDNN NHWC", cudnn_nhwc)
    record("cuDNN NCHW", cudnn_nchw)
    ours = package_build("implicit_gemm", spec_of(g))
    yp = cupy.empty((g["n"], *osz, g["k"]), dtype=cupy.float32)
    record("package NHWC", lambda: ours.launch([x, w], yp))
    first = package_build("implicit_gemm", spec_of(g, channels_last=False))
    yf = cupy.empty(first.plan.output.shape, dtype=cupy.float32)
    xf, wf = cupy.asarray(xc), cupy.asarray(wc)
    record("package NCHW", lambda: first.launch([xf, wf], yf))
    for bm, bn, stages, inline, transposed, blocks in configs:
        try:
            run, _, _ = build(g, bm, bn, stages, inline, transposed, blocks)
        except Exception as error:  # a configuration that does not fit: say so, go on
            print(f"{name} {bm}x{bn}x{stages}: {error}", flush=True)
            continue
        y = cupy.full((g["n"], *osz, g["k"]), cupy.nan, dtype=cupy.float32)
        wt = transposed_filter(g, w) if transposed else w
        maps = (encode_im2col(x.data.ptr, g, bm), encode_filter(wt.data.ptr, g, bn, transposed))
        step = (lambda: (refresh(g, w, wt), run(x, w, y, maps))) if transposed else (lambda: run(x, w, y, maps))
        step()
        got = torch.as_tensor(y, device="cuda")
        err = (torch.linalg.norm((got - ref_nhwc).double()) / torch.linalg.norm(ref_nhwc.double())).item()
        flags = (" inline" if inline else "") + (" B^T" if transposed else "") + (f" {blocks}/SM" if blocks > 1 else "")
        record(f"TMA {bm}x{bn} s{stages}{flags} (err {err:.1e})", step)
    print(f"\n{name}: {flops / 1e9:.1f} GFLOP")
    base = rows[0][1]
    for label, ms, tf in rows:
        print(f"  {label:34s} {ms:8.3f} ms {tf:6.1f} TFLOP/s  {base / ms:5.2f}x cuDNN NHWC", flush=True)


def main():
    configs = [(*(int(v) for v in c.split("b")[0].rstrip("it").split("x")), "i" in c, "t" in c,
                int(c.split("b")[1]) if "b" in c else 1)
               for c in os.environ.get("CONFIGS", "128x128x4t,256x64x4t").split(",")]
    names = sys.argv[1:] or ["checks", "conv8", "conv4", "c3d_conv2"]
    if names[0] == "profile":   # one launch of the first configuration, for ncu
        import cupy
        g, (bm, bn, stages, inline, transposed, blocks) = LAYERS[names[1]], configs[0]
        x = cupy.random.uniform(-1, 1, (g["n"], *g["size"], g["c"]), dtype=cupy.float32)
        w = cupy.random.uniform(-1, 1, (g["k"], *g["f"], g["c"]), dtype=cupy.float32)
        run, _, osz = build(g, bm, bn, stages, inline, transposed, blocks)
        y = cupy.empty((g["n"], *osz, g["k"]), dtype=cupy.float32)
        wt = transposed_filter(g, w) if transposed else w
        run(x, w, y, (encode_im2col(x.data.ptr, g, bm), encode_filter(wt.data.ptr, g, bn, transposed)))
        cupy.cuda.runtime.deviceSynchronize()
        return
    for name in names:
        if name == "checks":
            for check_name, g in CHECKS.items():
                check(check_name, g, configs)
        else:
            g = LAYERS[name]
            usable = [c for c in configs if c[1] <= max(64, -(-g["k"] // 64) * 64)]
            bench(name, g, usable)


if __name__ == "__main__":
    main()
