"""distmb/nn/kernels."""
