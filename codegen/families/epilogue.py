"""How the tensor-core kernels' epilogues store the accumulators (templates/common/epilogue.cu.j2).

An MMA leaves lane q of each quad (one output row) the channel pair 2q, 2q + 1 of every 8-channel column
group: stored as it lies, a 16-bit pair is a 4-byte store that fills half of each 32-byte sector it
touches, and an FP32 pair an 8-byte one. Exchanging pairs within the quad first gives every lane 16
contiguous bytes, as CUTLASS's and cuDNN's epilogues store (ncu on conv8 BF16, WGMMA kernel, H100:
the 4-byte stores held 37 % of the warps' stall samples; the 16-byte ones ran it 1.5x faster)."""
from __future__ import annotations

STORE_BYTES = 16
QUAD_CHANNELS = 32
"""Channels a quad's 16-bit stores cover: four lanes of 8."""
PAIR_CHANNELS = 16
"""Channels a quad's FP32 stores cover: two column groups of 8, two lanes each."""


def group_channels(mode: str) -> int:
    """Channels of a row that one group of a quad's 16-byte stores covers (0 without them)."""
    return {"quad": QUAD_CHANNELS, "pair": PAIR_CHANNELS}.get(mode, 0)


def store_mode(gemm_n: int, stores_float: bool, span: int, channels_last: bool) -> str:
    """"quad" (16-bit outputs: the quad's 4x4 transpose of its pairs), "pair" (FP32 outputs or partial sums:
    lanes 1 apart swap pairs), or "" (stored as the MMA leaves them) where an output row is not 16-byte
    aligned (K times the element's bytes), the tile's `span` of channels a warp stores is not whole groups,
    or channels are not contiguous."""
    mode, itemsize = ("pair", 4) if stores_float else ("quad", 2)
    if not channels_last or gemm_n % (STORE_BYTES // itemsize) or span % group_channels(mode):
        return ""
    return mode
