"""Measure the compile cache: the cold NVRTC compile of each demo kernel, a disk hit in a new
process, and a memory hit in the same process.

When to use it: after a change to the compile cache (its key, its entries, their checks), or to
see what the cache saves a user.  The kernels are those of ``convgen demo``, compiled for sm_90
into a temporary folder, so the user's cache is left alone.  Prints one line per kernel.

Needs no GPU, only the convgen package installed; runs from any folder.

example:
  python scripts/measure_cache.py
"""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codegen.api import plan
from codegen.compile import KernelCache, compile_source
from codegen.demo import cases
from codegen.render import render_kernels

CHILD = """
import sys, time
from pathlib import Path
from codegen.compile import KernelCache, compile_source
source = Path(sys.argv[2]).read_text()
start = time.perf_counter()
kernel = compile_source(source, arch="sm_90", cache=KernelCache(Path(sys.argv[1])))
print(kernel.source_hit, time.perf_counter() - start)
"""


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family, name, spec, tiles in cases():
            source = render_kernels(plan(family, spec, tiles)).code
            directory = Path(tmp) / f"{family}-{name}"
            cold = compile_source(source, arch="sm_90", cache=KernelCache(directory))
            cache = KernelCache(directory)
            compile_source(source, arch="sm_90", cache=cache)
            start = time.perf_counter()
            for _ in range(100):
                hit = compile_source(source, arch="sm_90", cache=cache)
            memory = (time.perf_counter() - start) / 100
            assert hit.source_hit == "memory"
            file = directory / "source.cu"
            file.write_text(source)
            disk = []
            for _ in range(3):
                out = subprocess.run([sys.executable, "-c", CHILD, str(directory), str(file)], capture_output=True,
                                     text=True, check=True).stdout.split()
                assert out[0] == "disk", out
                disk.append(float(out[1]))
            rows.append((f"{family}/{name}", cold.compile_seconds, statistics.median(disk), memory))
    print(f"{'kernel':24} {'cold compile':>13} {'disk hit (new process)':>23} {'memory hit':>11}")
    for name, cold, disk, memory in rows:
        print(f"{name:24} {cold * 1e3:10.1f} ms {disk * 1e3:20.2f} ms {memory * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
