"""The CUDA path (docs/cuda.md): PyTorch ops and Triton kernels, no nvcc.

- :func:`~distmb.cuda.idmap.fused_map`: FastGL's Fused-Map (unique + relabel into block
  positions over a device hash table; Triton kernel, or torch ops).
- :class:`~distmb.cuda.sampler.DeviceNeighborSampler`: the neighbour sampler of
  :mod:`distmb.sampling.neighbor` (same block contract) on any torch device, with the graph
  in device memory or read zero-copy from pinned host memory.
- :class:`~distmb.cuda.feature_cache.DeviceFeatures`: a static device cache of hot feature
  rows (PreSC / degree) over rows read by the GPU from pinned host memory
  (:mod:`distmb.cuda.zero_copy`); :mod:`distmb.cuda.reorder`: FastGL's Match-Reorder.
- :class:`~distmb.cuda.hec.DeviceHistoricalCache`: the historical embedding cache with its
  tables on a device (same results as the C++ one).
- :mod:`distmb.cuda.device` and :mod:`distmb.cuda.path`: ``--device`` and the GPU path's
  data stages as the trainer builds them.

Everything runs on CPU tensors too (Triton kernels under ``TRITON_INTERPRET=1``), which is how
CI tests it; ``pytest -m cuda`` runs the same tests on a GPU.
"""
