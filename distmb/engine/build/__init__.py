"""Assembly: everything a run needs, built once from a
:class:`~distmb.config.train.TrainConfig`, apart from the training loop that uses it.

- :mod:`~distmb.engine.build.run`: :func:`build_run`, one rank's whole run (:class:`RunParts`);
- :mod:`~distmb.engine.build.model`: the model and its optimizer;
- :mod:`~distmb.engine.build.adjacency`: where the samplers read neighbour lists from;
- :mod:`~distmb.engine.build.features`: the host feature sources (``--features``);
- :mod:`~distmb.engine.build.device_stages`: the device path's sampler and feature cache;
- :mod:`~distmb.engine.build.halo`: the halo scheme;
- :mod:`~distmb.engine.build.counters`: the per-epoch counters of the data path;
- :mod:`~distmb.engine.build.watchdog`: ``--collective-timeout``'s watchdog;
- :mod:`~distmb.engine.build.runtime`: threads, allocator, kernels, output paths;
- :mod:`~distmb.engine.build.data`: the graph of one rank.
"""

from distmb.engine.build.halo import make_halo_scheme
from distmb.engine.build.model import model_from_config
from distmb.engine.build.run import RunParts, build_run

__all__ = ["RunParts", "build_run", "make_halo_scheme", "model_from_config"]
