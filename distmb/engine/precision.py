"""``--precision``: the model's forward under autocast, the loss and the update in float32.

- ``fp32``: nothing changes.
- ``tf32``: float32 tensors throughout, but the training forward's and backward's float32
  matrix products run on TF32 tensor cores (inputs rounded to a 10-bit mantissa, products
  summed in float32; ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` inside
  :meth:`MixedPrecision.autocast` and :meth:`MixedPrecision.backward` only, restored after,
  so evaluation and everything else keep IEEE float32). CUDA only.
- ``bf16``: the training forward runs under ``torch.autocast(device_type, torch.bfloat16)``
  (CUDA or the CPU's autocast: the PyTorch-ops layers). On the CPU the fused C++ kernels
  (``--kernels fused``, the default there), which autocast does not reach, take bfloat16
  operands in their matrix products instead, forward and backward, and keep float32
  outputs (:func:`distmb.nn.kernels.cpu_update.bf16_products`). bfloat16 has float32's
  exponent range, so gradients need no scaling.
- ``fp16``: ``torch.autocast("cuda", torch.float16)`` with a :class:`torch.amp.GradScaler`
  (loss scaled before the backward, gradients unscaled before the all-reduce and the
  optimizer, steps with non-finite gradients skipped); CUDA only.

The parameters, their gradients and the optimizer state stay float32 (autocast casts copies
for the matrix products); the logits are cast to float32 before the loss; evaluation
(layer-wise inference) runs in float32. Which combinations are refused, and why:
:func:`distmb.config.train.precision_problem`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from distmb.config.train import precision_problem
from distmb.core.errors import InputError
from distmb.nn.kernels.cpu_update import bf16_native, bf16_products
from distmb.nn.kernels.dispatch import resolve_kernels

#: The autocast dtype of every ``--precision`` other than ``fp32``.
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def tf32_matmuls() -> Iterator[None]:
    """CUDA float32 matrix products on TF32 tensor cores inside the context; the previous
    setting (``torch.backends.cuda.matmul.fp32_precision``) is restored on exit."""
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


class MixedPrecision:
    """The training step's precision handling for one ``--precision`` on one device.

    Args:
        precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``.
        kernels: ``--kernels`` (with bf16 on the CPU, the fused kernels' products go bfloat16).
        device: the device the model trains on.

    Raises:
        InputError: a combination that cannot work (:func:`distmb.config.train.precision_problem`).
    """

    def __init__(self, precision: str, kernels: str, device: torch.device) -> None:
        problem = precision_problem(precision, device.type)
        if problem:
            raise InputError(problem)
        self.precision = precision
        self.device = device
        self.dtype = AUTOCAST_DTYPES.get(precision)
        #: Whether float32 matrix products run on TF32 tensor cores in the training step.
        self.tf32 = precision == "tf32"
        #: Whether the fused C++ kernels' products take bfloat16 operands in the training
        #: forward (bf16 on the CPU with the fused kernels).
        self.fused_bf16 = (
            precision == "bf16"
            and device.type == "cpu"
            and resolve_kernels(kernels, device) == "fused"
        )
        #: The run header's line on the precision, or None where it says nothing new.
        self.note: str | None = None
        if self.fused_bf16:
            how = (
                "AVX512-BF16"
                if bf16_native()
                else "portable C++: this build has no AVX512-BF16, no faster than --precision fp32"
            )
            self.note = (
                "--precision bf16: the fused kernels' matrix products on bfloat16 operands, "
                f"summed in float32 ({how}); other PyTorch ops under CPU autocast"
            )
        #: The fp16 loss scaler (None otherwise).
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The context of the training forward (nothing for ``fp32``)."""
        if self.tf32:
            with tf32_matmuls():
                yield
            return
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype), bf16_products(self.fused_bf16):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled for ``fp16``, its matrix products on TF32 for ``tf32``."""
        if self.tf32:
            with tf32_matmuls():
                loss.backward()
        elif self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (``fp16``), after they are all-reduced (so
        that every rank finds the same inf/nan) and before they are clipped or applied;
        nothing otherwise."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (``fp16``: skipped when a gradient is not finite, then the scale
        is updated)."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any] | None:
        """The scaler's state for checkpoints (None without one)."""
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore the scaler's state (a checkpoint of another precision has none: the
        scaler then starts afresh)."""
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
