"""The CUDA path (issue 12): PyTorch ops and Triton kernels, tested on CPU tensors in CI and on
a GPU under ``pytest -m cuda``. See docs/cuda.md."""
