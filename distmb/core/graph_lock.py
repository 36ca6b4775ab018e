"""One lock for CUDA graph captures and replays, and the CUDA random number generator.

PyTorch registers the default CUDA generator with every graph it captures
(``torch.cuda.CUDAGraph.capture_begin``): while any graph is being captured, that generator
is in capture mode, and any use of it outside the capture raises ``RuntimeError: Offset
increment outside graph capture encountered unexpectedly``: a random op such as dropout on
another thread, or a replay of another graph on another thread (a replay's prologue advances
the generator's offset, by zero for a graph that draws nothing, and checks the mode all the
same).

The BatchLoader's producer thread replays and captures the device sampler's graphs
(:mod:`distmb.pipeline.sample.graphed`) while the training thread runs steps that draw
dropout masks or replays and captures its own graph (:mod:`distmb.engine.graphed_step`). Each
holds :data:`GRAPH_LOCK` meanwhile, so that no capture overlaps another thread's use of the
generator. (Without it, two of the five runs of an H200 GPU benchmark with ``--cuda-graphs
--prefetch 2`` failed so; the lock has not yet run on a GPU.) Code that draws random numbers
on the GPU on another thread while a sampler with graphs runs must hold it too.
"""

from __future__ import annotations

import threading

#: Held around every capture and replay of the sampler's and the training step's graphs,
#: and around the training step's eager runs (re-entrant).
GRAPH_LOCK = threading.RLock()
