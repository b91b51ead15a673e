"""A/B of where the portable implicit GEMM pays its k-bound check (docs/perf.md, GEMM v34), on the
GPU.  Where C x taps is not a multiple of the slice depth, one slice is partial.  Until v34 it was
the last, and the check `row < K` sat in every copy of every slice; now it is the first (the
residue slice, as CUTLASS takes it), and only the prologue's copies test it.  Configurations:
``default_tiles`` as shipped ("residue first") and re-rendered as before v34 ("residue last"),
each at the other slice depth of 8 and 16 too (v33 took 8-deep slices where C x taps % 16 == 8
for the check's sake; v34 dropped that rule).  Measured as ``ab_harness`` does (checked against
cuDNN, interleaved rounds); layers whose C x taps is a multiple of 16 are skipped.

    PYTHONPATH=$PWD python3 scripts/ab_residue_slice.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import sys
import tempfile
from pathlib import Path

from ab_harness import run

LAST = "residue last"

EDITS = (
    ("{%- for entry in table %}", "{%- for entry in table[k_pad:] + table[:k_pad] %}"),
    ("const idx_t row = slot - {{ k_pad }};", "const idx_t row = slot;"),
    ('["(!residue || row >= 0)"]', '["row < " ~ GEMM_K]'),
    ('k_local{{ (" - " ~ k_pad) if k_tail }};', "k_local;"),
)
"""common/gemm.cu.j2 edits that render the kernel as it was before v34: the table's padding rows at
its end, rows unshifted, and `row < K` in every copy (the `residue` flag is left unread)."""


def residue_last(text: str) -> str:
    """common/gemm.cu.j2 with the partial slice last again (``EDITS``)."""
    for old, new in EDITS:
        if old not in text:
            raise SystemExit(f"ab_residue_slice: {old!r} is no longer in common/gemm.cu.j2; update the edit")
        text = text.replace(old, new)
    return text


def candidate_tiles(spec) -> dict[str, dict] | None:
    """``default_tiles`` with the residue slice first and last, at its depth and at the other of 8
    and 16."""
    from codegen import index
    from codegen.families.implicit_gemm import ImplicitGemm

    tiles = ImplicitGemm().default_tiles(spec).to_dict()
    if index.gemm_sizes(index.IndexAlgebra(spec))[2] % 16 == 0:
        return None
    configs = {}
    for depth in (tiles["block_k"], 8 if tiles["block_k"] == 16 else 16):
        suffix = "" if depth == tiles["block_k"] else f" bk{depth}"
        configs["residue first" + suffix] = configs[LAST + suffix] = {**tiles, "block_k": depth}
    return configs


if __name__ == "__main__":
    from codegen import render

    scratch = Path(tempfile.mkdtemp(prefix="ab_residue_"))
    last = render.edited_templates(scratch, "last", residue_last, template="common/gemm.cu.j2")
    sys.exit(run(__doc__, candidate_tiles, LAST, "ab-residue-slice.json", layouts=("NCHW", "NHWC"),
                 templates={name: last for name in (LAST, LAST + " bk8", LAST + " bk16")}))
