"""Build of the C++ extension ``distmb._C`` only; all metadata lives in setup.cfg.

The extension does not link against libtorch: kernels take numpy buffers (CPU tensors pass
zero-copy through ``Tensor.numpy()``), so it builds without torch and survives torch upgrades.
"""

import os
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# The sources compile one at a time unless MAX_JOBS says how many at once (0: one per core):
# `MAX_JOBS=16 python setup.py build_ext --inplace` (benchmarks/gpu_check.py does that).
ParallelCompile("MAX_JOBS", default=1).install()

# Clusters build from source on the nodes they run on, so tune for the build host by default;
# set DISTMB_MARCH (e.g. x86-64-v3) for a portable build.
MARCH = os.environ.get("DISTMB_MARCH", "native")

ext = Pybind11Extension(
    "distmb._C",
    sorted(glob("csrc/**/*.cpp", recursive=True)),
    include_dirs=["csrc/include"],
    extra_compile_args=["-O3", "-fopenmp", f"-march={MARCH}", "-fno-math-errno"],
    extra_link_args=["-fopenmp"],
    cxx_std=17,
)

setup(ext_modules=[ext], cmdclass={"build_ext": build_ext})
