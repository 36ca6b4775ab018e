"""The historical embedding cache (HEC) halo scheme of DistGNN-MB.

- :mod:`~distmb.halo.hec.contract`: the cache contract (:class:`EmbeddingCache`), its constants
  and the argument validation every cache shares;
- :mod:`~distmb.halo.hec.host`: :class:`HistoricalEmbeddingCache`, the C++ cache;
- :mod:`~distmb.halo.hec.device`: :class:`DeviceHistoricalCache`, the same cache as tensors on
  any torch device;
- :mod:`~distmb.halo.hec.push_select`: which rows each rank pushes to its peers;
- :mod:`~distmb.halo.hec.transport`: the embedding pushes (:class:`EmbeddingTransport`);
- :mod:`~distmb.halo.hec.scheme`: :class:`HistoricalEmbeddingScheme`, the halo scheme that
  keeps one cache per layer filled by asynchronous embedding pushes.
"""
