"""The CUDA path: device-resident counterparts of the CPU (C++) components, written as
PyTorch ops or Triton kernels so that the same code runs, and is tested, on CPU tensors.

- :mod:`distmb.cuda.hec`: :class:`~distmb.cuda.hec.DeviceHistoricalCache`, the historical
  embedding cache with its tables on a device.
"""
