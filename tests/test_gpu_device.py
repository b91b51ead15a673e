"""GPU tier of the device description: the card is read from the driver, and what build() chooses
on it is what the same numbers chose on the CPU."""
import dataclasses

import pytest

from codegen import ConvSpec, build, plan
from codegen import device as devices

pytestmark = pytest.mark.gpu


def test_the_card_is_read_from_the_driver_and_chosen_for():
    import cupy

    here = devices.present()
    attributes = cupy.cuda.Device().attributes
    assert here.sm_count == attributes["MultiProcessorCount"] > 0
    assert here.shared_per_block == attributes["MaxSharedMemoryPerBlockOptin"] >= 48 << 10
    assert here.shared_per_sm >= here.shared_per_block and here.registers_per_sm >= 32768
    assert here.arch == f"sm_{cupy.cuda.Device().compute_capability}" and here.l2_bytes > 0
    assert devices.resolve(None, None) == here
    spec = ConvSpec(dims=2, layout="NHWC", n=16, c=64, k=128, input_size=(28, 28), filter_size=3, padding=1)
    described = dataclasses.replace(here, name="the same numbers, described")
    assert plan("implicit_gemm", spec).tiles == plan("implicit_gemm", spec, target=described).tiles
    kernel = build("implicit_gemm", spec)
    assert kernel.compiled.arch.startswith(here.arch)
