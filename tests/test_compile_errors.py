"""Compile errors a user can act on (issue 37): an NVRTC failure names the family, spec and tiles
and shows the numbered source lines around each error; CONVGEN_CACHE_SAVE_SOURCE keeps each
compiled source beside its cubin, and the cache counts and clears those files as its own."""
import dataclasses

import pytest

from codegen import api, plan
from codegen.compile import CompileError, KernelCache, default_cache
from codegen.spec import ConvSpec

SPEC = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=4, input_size=(8, 8), filter_size=3, padding=1)


def test_a_failed_compile_names_the_kernel_and_shows_the_lines_around_the_error(monkeypatch, cache_dir):
    real = api.render_kernels

    def broken(kernel_plan):
        source = real(kernel_plan)
        return dataclasses.replace(source, code=source.code.replace("float acc = 0.0f;", "float acc = no_such_name;", 1))

    monkeypatch.setattr(api, "render_kernels", broken)
    kernel_plan = plan("direct", SPEC, {"variant": "basic"})
    with pytest.raises(CompileError) as err:
        api.compile_plan(kernel_plan, "sm_90")
    message = str(err.value)
    assert message.startswith(f"direct (basic) for {SPEC.describe()} with tiles {kernel_plan.tiles.describe()}, sm_90")
    assert 'identifier "no_such_name" is undefined' in message
    marked = [line for line in message.splitlines() if line.startswith(">")]
    assert len(marked) == 1 and "float acc = no_such_name;" in marked[0]
    number = int(marked[0][1:].split("|")[0])
    assert f"({number}): error" in message
    assert message.count("source around line") == 1


def test_saved_sources_sit_beside_their_cubins_and_belong_to_the_cache(monkeypatch, cache_dir):
    monkeypatch.setenv("CONVGEN_CACHE_SAVE_SOURCE", "1")
    monkeypatch.setattr("codegen.compile._CACHE", None)
    kernel = api.build("im2col", SPEC)
    saved = cache_dir / f"{kernel.compiled.key}.cu"
    assert saved.read_text() == kernel.source.code and (cache_dir / f"{kernel.compiled.key}.cubin").exists()
    (cache_dir / "mine.cu").write_text("// not convgen's\n")
    cache = KernelCache(cache_dir)
    assert cache.info()["entries"] == 1 and cache.info()["foreign"] == 1
    assert cache.clear() == 2 and not saved.exists() and (cache_dir / "mine.cu").exists()


def test_sources_are_not_saved_unless_asked(monkeypatch, cache_dir):
    monkeypatch.delenv("CONVGEN_CACHE_SAVE_SOURCE", raising=False)
    monkeypatch.setattr("codegen.compile._CACHE", None)
    api.build("im2col", SPEC)
    assert not list(cache_dir.glob("*.cu")) and default_cache().directory == cache_dir
