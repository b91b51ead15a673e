"""Typed template contexts: every family hands its template a checked TemplateContext, not a dict."""
import dataclasses

import pytest

from codegen.api import plan
from codegen.families import FAMILIES
from codegen.families.base import ContextError, TemplateContext
from codegen.families.col2im import Col2imVariant
from codegen.families.direct import DirectVariant
from codegen.families.gemm_tiles import GemmVariant
from codegen.families.im2col import Im2colVariant
from codegen.spec import ConvSpec

SPECS = (
    ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=4, input_size=(9, 10), filter_size=3, padding=1),
    ConvSpec(dims=2, layout="NHWC", n=1, c=8, k=5, input_size=(7, 8), filter_size=(3, 2), stride=2, dilation=(1, 2)),
    ConvSpec(dims=3, layout="NCDHW", n=1, c=2, k=3, input_size=(4, 5, 6), filter_size=2, padding=(0, 1, 1)),
)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.layout.value)
def test_every_family_plans_a_typed_context(family, spec):
    context = plan(family, spec).context
    assert isinstance(context, TemplateContext), type(context)
    assert context.variables()["kernel"] == context.kernel


def test_a_wrong_typed_field_names_its_class_and_field():
    context = plan("im2col", SPECS[0]).context
    with pytest.raises(ContextError, match=r"Im2colContext\.cols = '12' is not"):
        dataclasses.replace(context, cols="12")
    with pytest.raises(ContextError, match=r"Im2colContext\.variant = 'channels_first' is not"):
        dataclasses.replace(context, variant="channels_first")      # the enum, not its spelling
    with pytest.raises(ContextError, match=r"Im2colContext\.largest_index = True"):
        dataclasses.replace(context, largest_index=True)            # a bool is not an int here
    direct = plan("direct", SPECS[0], {"variant": "tiled_register"}).context
    with pytest.raises(ContextError, match=r"DirectContext\.copy = \{"):
        dataclasses.replace(direct, copy=dataclasses.asdict(direct.copy))


@pytest.mark.parametrize("family, tiles, variant", [
    ("im2col", None, Im2colVariant.CHANNELS_FIRST),
    ("col2im", {"algorithm": "scatter"}, Col2imVariant.SCATTER),
    ("direct", {"variant": "tiled_register"}, DirectVariant.TILED_REGISTER),
    ("im2win", {"precomp": False}, GemmVariant.ANALYTIC),
])
def test_variables_give_the_template_enum_values_as_strings(family, tiles, variant):
    kernel_plan = plan(family, SPECS[0], tiles)
    assert kernel_plan.context.variant is variant
    variables = kernel_plan.context.variables()
    assert type(variables["variant"]) is str and variables["variant"] == variant.value == kernel_plan.variant
    assert not any(isinstance(value, type(variant)) for value in variables.values())
