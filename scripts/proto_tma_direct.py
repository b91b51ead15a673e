"""Prototype for issue 3 (not part of the package): the single-channel 8192^2 filter as a
warp-specialised kernel fed by Hopper's tensor memory accelerator (TMA).

One producer thread per block issues one ``cp.async.bulk.tensor.2d`` per output tile: a box of
(8R + 2*radius) rows x 136 columns starting at the 16-byte-aligned column 4 left of the tile, with
the hardware filling everything outside the image with zeros (the padding costs nothing).  The
box lands in one of ``stages`` shared buffers and completes on that buffer's "full" mbarrier; the
8 consumer warps wait on it, compute a 8R x 128 output tile (R x 4 outputs per thread, the
package's register tile: each 12-float window read once feeds every filter row that uses it),
release the buffer on its "empty" mbarrier and store.  Blocks are persistent (SMs x blocks per
SM) and walk the tiles; no block-wide barrier runs in the loop.  Measured on the H100 against
the package's tiled_register and a device copy in the same process: docs/perf.md, direct v8.

Limits that a package variant would lift: 2D NCHW, one channel, stride and dilation 1, radius
<= 4, 8192 x 8192; the tensor map sits in ``__constant__`` memory (the package would pass it as
a ``__grid_constant__`` parameter, so concurrent launches cannot race on it).

Usage (repo root, GPU with sm_90, PyTorch for the float64 reference):

    PYTHONPATH=$PWD python3 scripts/proto_tma_direct.py 1 2 3 4
    CONFIGS=4x6x1,4x4x2 PYTHONPATH=$PWD python3 scripts/proto_tma_direct.py 4

CONFIGS lists R x stages x blocks-per-SM triples.
"""
import ctypes
import os
import statistics
import sys

import numpy as np

H = W = 8192
BOX_COLS = 136     # 128 outputs plus up to 4 halo columns each side, a multiple of 16 bytes
SOURCE = r'''
#define H 8192
#define W 8192
#define R {rows}
#define RAD {radius}
#define S (2 * RAD + 1)
#define TH (8 * R)
#define TW 128
#define BOX_R (TH + 2 * RAD)
#define BOX_C {box_cols}
#define STAGES {stages}
#define STAGE ((BOX_R * BOX_C + 31) / 32 * 32)   // floats; every stage starts 128-byte aligned
#define TILES_X (W / TW)
#define TILES (TILES_X * (H / TH))
__constant__ float filter_taps[S * S];
__constant__ __align__(64) unsigned long long tensor_map[16];

__device__ __forceinline__ unsigned shared_address(const void* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}
__device__ __forceinline__ void barrier_init(unsigned long long* b, unsigned count) {{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(shared_address(b)), "r"(count));
}}
__device__ __forceinline__ void barrier_wait(unsigned long long* b, unsigned parity) {{
    asm volatile("{{\n .reg .pred done;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 " @!done bra WAIT_%=;\n}}" :: "r"(shared_address(b)), "r"(parity) : "memory");
}}
__device__ __forceinline__ void barrier_arrive(unsigned long long* b) {{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(shared_address(b)) : "memory");
}}
__device__ __forceinline__ void barrier_expect(unsigned long long* b, unsigned bytes) {{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(shared_address(b)), "r"(bytes) : "memory");
}}

extern "C" __global__ void __launch_bounds__(288, {blocks})
filter_tma(float* __restrict__ y)
{{
    extern __shared__ __align__(1024) float boxes[];
    __shared__ __align__(8) unsigned long long full[STAGES], empty[STAGES];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (tid == 0) {{
        for (int s = 0; s < STAGES; ++s) {{ barrier_init(&full[s], 1); barrier_init(&empty[s], 8); }}
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }}
    __syncthreads();
    if (warp == 8) {{                      // producer: one thread, one box per tile
        if (lane == 0) {{
            for (int i = 0, t = blockIdx.x; t < TILES; ++i, t += gridDim.x) {{
                const int s = i % STAGES;
                if (i >= STAGES) barrier_wait(&empty[s], ((i / STAGES) - 1) & 1);
                const int row0 = (t / TILES_X) * TH, col0 = (t % TILES_X) * TW;
                barrier_expect(&full[s], BOX_R * BOX_C * 4);
                asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                             " [%0], [%1, {{%2, %3}}], [%4];"
                             :: "r"(shared_address(boxes + s * STAGE)), "l"((unsigned long long)tensor_map),
                                "r"(col0 - 4), "r"(row0 - RAD), "r"(shared_address(&full[s])) : "memory");
            }}
        }}
        return;
    }}
    const int tx = tid % 32, ty = tid / 32, c0 = tx * 4;
    for (int i = 0, t = blockIdx.x; t < TILES; ++i, t += gridDim.x) {{
        const int s = i % STAGES;
        barrier_wait(&full[s], (i / STAGES) & 1);
        const float* box = boxes + s * STAGE;
        float acc[R][4];
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[u][v] = 0.f;
#pragma unroll
        for (int r = 0; r < R + 2 * RAD; ++r) {{
            const float* row = box + (ty * R + r) * BOX_C + c0;
            float window[12];
#pragma unroll
            for (int q = 0; q < 3; ++q) {{
                const float4 v = *reinterpret_cast<const float4*>(row + 4 * q);
                window[4 * q] = v.x; window[4 * q + 1] = v.y; window[4 * q + 2] = v.z; window[4 * q + 3] = v.w;
            }}
#pragma unroll
            for (int u = 0; u < R; ++u) {{
                const int ka = r - u;
                if (ka < 0 || ka >= S) continue;
#pragma unroll
                for (int kb = 0; kb < S; ++kb) {{
                    const float tap = filter_taps[ka * S + kb];
#pragma unroll
                    for (int v = 0; v < 4; ++v) acc[u][v] += tap * window[v + kb + 4 - RAD];
                }}
            }}
        }}
        __syncwarp();
        if (lane == 0) barrier_arrive(&empty[s]);
        const int row0 = (t / TILES_X) * TH, col0 = (t % TILES_X) * TW;
#pragma unroll
        for (int u = 0; u < R; ++u)
            *reinterpret_cast<float4*>(y + (size_t)(row0 + ty * R + u) * W + col0 + c0) =
                make_float4(acc[u][0], acc[u][1], acc[u][2], acc[u][3]);
    }}
}}
'''


def encode_tensor_map(pointer: int, box_rows: int) -> np.ndarray:
    """cuTensorMapEncodeTiled for the W x H fp32 image: box BOX_COLS x box_rows, no interleave, no
    swizzle, 128-byte L2 promotion, zero fill outside the image."""
    cuda = ctypes.CDLL("libcuda.so.1")
    tensor_map = (ctypes.c_ubyte * 128)()
    dims = (ctypes.c_uint64 * 2)(W, H)
    strides = (ctypes.c_uint64 * 1)(W * 4)
    box = (ctypes.c_uint32 * 2)(BOX_COLS, box_rows)
    element_strides = (ctypes.c_uint32 * 2)(1, 1)
    float32, interleave_none, swizzle_none, promote_128b, fill_zero = 7, 0, 0, 2, 0
    status = cuda.cuTensorMapEncodeTiled(ctypes.byref(tensor_map), float32, 2, ctypes.c_void_p(pointer), dims, strides,
                                         box, element_strides, interleave_none, swizzle_none, promote_128b, fill_zero)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled returned {status}")
    return np.frombuffer(bytes(tensor_map), dtype=np.uint64)


def median_ms(fn, repeats: int = 20) -> float:
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main(radii: list[int], configs: list[tuple[int, int, int]]) -> None:
    import cupy
    import torch
    import torch.nn.functional as F

    from codegen.api import build
    from codegen.bench import layer_spec, load_shapes, tiles_for

    rng = np.random.default_rng(0)
    x = cupy.asarray(rng.uniform(-1, 1, (H, W)).astype(np.float32))
    copy_target = cupy.empty_like(x)
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    lines = []
    for radius in radii:
        size = 2 * radius + 1
        w = rng.uniform(-1, 1, (size, size)).astype(np.float32)
        expected = F.conv2d(torch.from_dlpack(x).view(1, 1, H, W).double(),
                            torch.from_numpy(w).cuda().view(1, 1, size, size).double(), padding=radius).view(H, W)
        layer = {l["name"]: l for l in load_shapes()["filter2d"]}[f"filter_r{radius}"]
        spec = layer_spec(layer, "NCHW", 1)
        package = build("direct", spec, tiles_for(spec, "tiled_register"))
        package_out = cupy.empty((1, 1, H, W), cupy.float32)
        package_args = [x.reshape(1, 1, H, W), cupy.asarray(w.reshape(1, 1, size, size))]
        kernels = {}
        for rows, stages, blocks in configs:
            box_rows = 8 * rows + 2 * radius
            shared = stages * (-(-box_rows * BOX_COLS // 32) * 32) * 4
            if shared * blocks > 227 * 1024:
                continue
            module = cupy.RawModule(code=SOURCE.format(rows=rows, radius=radius, box_cols=BOX_COLS, stages=stages,
                                                       blocks=blocks), options=("-std=c++17",))
            cupy.ndarray(size * size, cupy.float32, module.get_global("filter_taps"))[...] = cupy.asarray(w.ravel())
            cupy.ndarray(16, cupy.uint64, module.get_global("tensor_map"))[...] = cupy.asarray(
                encode_tensor_map(x.data.ptr, box_rows))
            function = module.get_function("filter_tma")
            function.max_dynamic_shared_size_bytes = shared
            kernels[f"TMA {rows}x4 per thread, {stages} stages, {blocks} block(s)/SM"] = (function, shared, blocks)
        times: dict[str, list[float]] = {}
        for _ in range(3):
            times.setdefault("copy", []).append(median_ms(lambda: copy_target.__setitem__(Ellipsis, x)))
            for name, (function, shared, blocks) in kernels.items():
                y = cupy.full((H, W), cupy.nan, cupy.float32)
                launch = lambda: function((sms * blocks,), (288,), (y,), shared_mem=shared)
                launch()
                cupy.cuda.runtime.deviceSynchronize()
                error = float((torch.from_dlpack(y).double() - expected).norm() / expected.norm())
                if error > 1e-6 or bool(cupy.isnan(y).any()):
                    raise AssertionError(f"radius {radius}, {name}: relative error {error:.2e} or unwritten outputs")
                times.setdefault(name, []).append(median_ms(launch))
            times.setdefault("tiled_register (convgen)", []).append(
                median_ms(lambda: package.launch(package_args, package_out)))
        copy_ms = statistics.median(times.pop("copy"))
        for name, values in times.items():
            ms = statistics.median(values)
            lines.append(f"radius {radius}  {name:44s} {ms:.4f} ms  {copy_ms / ms:.3f} of copy")
        lines.append(f"radius {radius}  copy of the same bytes {copy_ms:.4f} ms")
    print("\n".join(lines))


if __name__ == "__main__":
    chosen = os.environ.get("CONFIGS", "4x4x1,4x6x1,4x4x2,4x2x4,8x3x1,2x8x1")
    main([int(a) for a in sys.argv[1:]] or [4], [tuple(int(v) for v in c.split("x")) for c in chosen.split(",")])
