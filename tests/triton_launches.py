"""The Triton launches of a run on CPU tensors under Triton's interpreter, each with the
signature a GPU run would compile its kernel for, and their compilation for a GPU target
(sm_90) without a GPU.

- :class:`LaunchRecorder` wraps the ``run`` of the kernel classes that
  :mod:`distmb.engine.op_census` counts launches of (``kernel[grid](...)``) and turns each
  launch's arguments into a :class:`Launch`: Triton's own binder for the CUDA back end
  (the one ``JITFunction.run`` calls on a GPU) types every argument (a tensor ``*fp32``,
  ``*i64``, ``*u1`` ...; a Python int ``i32``, ``i64`` or ``u64`` by its value, or the
  constant 1 where the parameter is specialised; a float ``fp32``), records the
  divisibility by 16 of pointers and specialised ints as attributes, and the constexprs'
  values. It also records the ``@triton.jit`` functions the kernels call (compiled inside
  them).
- :func:`compile_for_gpu` compiles every distinct launch with ``triton.compile`` for
  :data:`TARGET` in one fresh interpreter without ``TRITON_INTERPRET`` (kernels defined
  under the interpreter are bound to it) and returns the failures, each naming its kernel
  and signature.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The compile target: ``GPUTarget(backend, arch, warp_size)``, an H100's (sm_90).
TARGET = ("cuda", 90, 32)

#: A path into a kernel's arguments (``(i,)`` for its i-th parameter), as Triton keys
#: constexprs and attributes.
ArgPath = tuple[int, ...]


@dataclass(frozen=True)
class Launch:
    """One kernel's compile request as a GPU run would make it.

    Attributes:
        module, name: where the kernel is defined (``getattr(import_module(module), name)``).
        signature: ``(parameter, type)`` for every parameter: ``*fp32``, ``i32``,
            ``constexpr`` (a constexpr parameter, or an int specialised to 1) ...
        constexprs: ``(path, value)`` of the constexpr entries of ``signature``.
        attrs: ``(path, attributes)`` of pointers and specialised ints: ``tt.divisibility``
            16 where the launch's value was (none otherwise).
        options: the launch's compile options (``num_warps`` ...), as given.
    """

    module: str
    name: str
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[ArgPath, Any], ...]
    attrs: tuple[tuple[ArgPath, tuple], ...]
    options: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> tuple:
        """What tells two compiles apart but for ``attrs``: the kernel, its signature,
        constexprs and options."""
        return self.module, self.name, self.signature, self.constexprs, self.options

    def describe(self) -> str:
        """``module.name(param: type, ..., CONST=value, ...) [options]``, for a message
        (``type/16``: divisible by 16)."""
        values = {self.signature[path[0]][0]: value for path, value in self.constexprs}
        aligned = {self.signature[path[0]][0] for path, attrs in self.attrs if attrs}
        params = [
            f"{p}={values[p]!r}" if t == "constexpr" else f"{p}: {t}{'/16' * (p in aligned)}"
            for p, t in self.signature
        ]
        options = f" {dict(self.options)}" if self.options else ""
        return f"{self.module}.{self.name}({', '.join(params)}){options}"


def _frozen(value: Any) -> Any:  # noqa: ANN401 - nested lists of attributes
    """``value`` with its lists as tuples (hashable)."""
    return tuple(_frozen(v) for v in value) if isinstance(value, list | tuple) else value


class LaunchRecorder:
    """Records the Triton launches made inside :meth:`recording` (every thread).

    Attributes:
        launches: each distinct :class:`Launch` and how many times it ran.
        called: ``(module, name)`` of the ``@triton.jit`` functions called from inside a
            kernel (under the interpreter only: a compiled kernel's calls are not Python's).
    """

    def __init__(self) -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.launches: Counter[Launch] = Counter()
        self.called: set[tuple[str, str]] = set()
        self._backend = make_backend(GPUTarget(*TARGET))
        self._binders: dict[int, tuple[Any, Any]] = {}

    def _jit_and_binder(self, kernel: Any) -> tuple[Any, Any]:  # noqa: ANN401
        """``kernel`` as a ``JITFunction`` (an interpreted kernel rebuilt from its Python
        function and decorator arguments) and its CUDA argument binder."""
        from triton.runtime.jit import JITFunction, create_function_from_signature

        key = id(kernel)
        if key not in self._binders:
            jit = kernel
            if not isinstance(kernel, JITFunction):  # interpreted: rebuilt for the compiler
                jit = JITFunction(kernel.fn, **kernel.kwargs)
            binder = create_function_from_signature(jit.signature, jit.params, self._backend)
            self._binders[key] = (kernel, (jit, binder))  # keeps kernel alive: its id stays
        return self._binders[key][1]

    def launch_of(self, kernel: Any, args: tuple, kwargs: dict) -> Launch:  # noqa: ANN401
        """The :class:`Launch` of ``kernel[grid](*args, **kwargs)`` on a GPU."""
        jit, binder = self._jit_and_binder(kernel)
        bound, specialization, options = binder(*args, **kwargs)
        with warnings.catch_warnings():  # the compile options' defaults, unused here
            warnings.simplefilter("ignore", UserWarning)
            _, signature, constexprs, attrs = jit._pack_args(
                self._backend, dict(kwargs), bound, specialization, options
            )
        return Launch(
            module=jit.fn.__module__,
            name=jit.fn.__name__,
            signature=tuple(signature.items()),
            constexprs=tuple(sorted(constexprs.items())),
            attrs=tuple(sorted((path, _frozen(a)) for path, a in attrs.items())),
            options=tuple(sorted(options.items())),
        )

    def distinct(self) -> list[Launch]:
        """One launch per :attr:`Launch.key`, the first recorded: launches that differ only
        in which arguments happen to be divisible by 16 (hints to the code generator) are
        compiled once."""
        first: dict[tuple, Launch] = {}
        for launch in self.launches:
            first.setdefault(launch.key, launch)
        return list(first.values())

    @contextmanager
    def recording(self) -> Iterator[LaunchRecorder]:
        """Record the launches (and the interpreter's device-function calls) meanwhile."""
        from distmb.engine.op_census import triton_kernel_classes

        undo: list[tuple[type, str, Any]] = []
        for kernel_class in triton_kernel_classes():
            undo.append((kernel_class, "run", vars(kernel_class)["run"]))
            kernel_class.run = self._recording_run(kernel_class.run)
            if kernel_class.__name__ == "InterpretedFunction":  # a call: a device function's
                undo.append((kernel_class, "__call__", vars(kernel_class)["__call__"]))
                kernel_class.__call__ = self._recording_call(kernel_class.__call__)
        try:
            yield self
        finally:
            for owner, name, original in reversed(undo):
                setattr(owner, name, original)

    def _recording_run(self, run: Any) -> Any:  # noqa: ANN401
        def wrapped(kernel: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:  # noqa: ANN401
            self.launches[self.launch_of(kernel, args, kwargs)] += 1
            return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)

        return wrapped

    def _recording_call(self, call: Any) -> Any:  # noqa: ANN401
        def wrapped(function: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
            self.called.add((function.fn.__module__, function.fn.__name__))
            return call(function, *args, **kwargs)

        return wrapped


def _compile_one(request: tuple, target: tuple) -> str | None:
    """Compile one request of :func:`compile_for_gpu` (in the child): None, or the failure:
    the kernel's description, the compiler's error and what it wrote to the standard error
    (MLIR's diagnostics)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, signature, constexprs, attrs, options, describe = request
    kernel = getattr(importlib.import_module(module), name)
    with tempfile.TemporaryFile() as diagnostics:
        saved = os.dup(2)
        os.dup2(diagnostics.fileno(), 2)
        try:
            src = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
            compiled = triton.compile(src, target=GPUTarget(*target), options=options)
            assert len(compiled.asm["cubin"]) > 0, "empty cubin"
            return None
        except Exception as exc:  # noqa: BLE001 - every error is reported, by kernel
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        diagnostics.seek(0)
        written = diagnostics.read().decode(errors="replace").strip()
    return "\n".join([describe, error, written]).replace("\n", "\n    ").strip()


def _compile_main(requests_path: str, report_path: str) -> int:
    """The child of :func:`compile_for_gpu`: compile every request of the pickle at
    ``requests_path``, write the report (JSON) to ``report_path``; 1 on a failure."""
    requests, target = pickle.loads(Path(requests_path).read_bytes())
    start = time.perf_counter()
    failures = [f for f in (_compile_one(r, target) for r in requests) if f is not None]
    report = {
        "compiled": len(requests) - len(failures),
        "failures": failures,
        "seconds": round(time.perf_counter() - start, 2),
    }
    Path(report_path).write_text(json.dumps(report))
    return 1 if failures else 0


def compile_for_gpu(launches: list[Launch], cache_dir: str | None = None) -> dict[str, Any]:
    """Compile each of ``launches`` for :data:`TARGET` in one fresh interpreter without
    ``TRITON_INTERPRET``; ``cache_dir``: Triton's compile cache there (its default
    otherwise).

    Returns:
        ``{"compiled": int, "failures": [str, ...], "seconds": float}``: each failure the
        kernel's :meth:`Launch.describe` and the compiler's error.

    Raises:
        RuntimeError: the child died without a report.
    """
    requests = [
        (
            launch.module,
            launch.name,
            dict(launch.signature),
            dict(launch.constexprs),
            {path: [list(a) for a in attrs] for path, attrs in launch.attrs},
            dict(launch.options),
            launch.describe(),
        )
        for launch in launches
    ]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if cache_dir is not None:
        env["TRITON_CACHE_DIR"] = cache_dir
    with tempfile.TemporaryDirectory() as tmp:
        requests_path, report_path = Path(tmp, "requests.pkl"), Path(tmp, "report.json")
        requests_path.write_bytes(pickle.dumps((requests, TARGET)))
        out = subprocess.run(
            [sys.executable, __file__, str(requests_path), str(report_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if not report_path.is_file():
            raise RuntimeError(f"the compiling child died (exit {out.returncode}):\n{out.stderr}")
        return json.loads(report_path.read_text())


if __name__ == "__main__":
    sys.exit(_compile_main(*sys.argv[1:]))
