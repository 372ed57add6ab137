"""The PyTorch engine: shared scheduling and sampling rules; forward pass, paged KV pool and sampling in torch.

TorchEngine (which imports torch) loads on first use of the name.
"""
from __future__ import annotations

__all__ = ["TorchDeviceError", "TorchEngine"]


def __getattr__(name: str):
    if name in ("TorchEngine", "TorchDeviceError"):
        from inferd.engine.torch import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
