"""convgen: convolution specs rendered into specialised CUDA kernels.

    spec = codegen.ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=8, input_size=(32, 32), filter_size=(3, 3))
    col = codegen.build("im2col", spec)(x)
    codegen.emit("im2col", spec, "out.cu")
"""
from codegen.version import __version__  # noqa: E402
from codegen.api import Kernel, LaunchError, build, has_gpu, plan  # noqa: E402
from codegen.emit import emit  # noqa: E402
from codegen.spec import ConvSpec, DType, Layout, SpecError  # noqa: E402

__all__ = ["ConvSpec", "DType", "Kernel", "Layout", "LaunchError", "SpecError", "build", "emit", "has_gpu", "plan",
           "__version__"]
