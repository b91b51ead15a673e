"""convgen: convolution specs rendered into specialised CUDA kernels."""
__version__ = "0.1.0"
