"""Host arrays to the device in one copy: packed into one byte buffer, pinned on CUDA, copied without a wait.

A step's small per-row data (sampling parameters, penalty token ids, grammar masks) would cost one copy, and on
CUDA one pageable-memory stall, per array; packed, it is one asynchronous copy the GPU runs in order with the
kernels that read it.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

_ALIGN = 16          # every array starts at a multiple of this: a uint8 slice views as any dtype up to 16 bytes
_DTYPES = {np.dtype(np.bool_): torch.bool, np.dtype(np.uint8): torch.uint8, np.dtype(np.int32): torch.int32,
           np.dtype(np.int64): torch.int64, np.dtype(np.float32): torch.float32,
           np.dtype(np.float64): torch.float64}


class HostUpload:
    """Sends named host arrays to one device in a single host->device copy.

    The arrays are packed into a staging buffer kept for this object's life (pinned on CUDA, so the copy is
    `non_blocking` and the host never waits for it) and copied into a fresh device buffer, which each returned
    tensor views. The staging buffer is refilled only once the previous copy out of it has finished (an
    event; a step's results come back after its copy, so that wait is over before the next step begins).
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._cuda = self.device.type == "cuda"
        self._staging = torch.empty(0, dtype=torch.uint8)
        self._copied: torch.cuda.Event | None = None

    def send(self, arrays: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Each array as a tensor on the device (same dtype and shape), all from one copy."""
        layout = []
        total = 0
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            if array.dtype not in _DTYPES:
                raise TypeError(f"{name}: cannot upload an array of dtype {array.dtype}")
            layout.append((name, array, total))
            total += -(-array.nbytes // _ALIGN) * _ALIGN
        staging = self._reserve(total)
        host = staging.numpy()
        for _, array, offset in layout:
            host[offset:offset + array.nbytes] = array.reshape(-1).view(np.uint8)
        packed = torch.empty(total, dtype=torch.uint8, device=self.device)
        packed.copy_(staging[:total], non_blocking=self._cuda)
        if self._cuda:
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()
        return {name: packed[offset:offset + array.nbytes].view(_DTYPES[array.dtype]).view(array.shape)
                for name, array, offset in layout}

    def _reserve(self, nbytes: int) -> torch.Tensor:
        if self._copied is not None:
            self._copied.synchronize()
        if self._staging.numel() < nbytes:
            size = max(nbytes, 2 * self._staging.numel(), 4096)
            self._staging = torch.empty(size, dtype=torch.uint8, pin_memory=self._cuda)
        return self._staging


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """One small host array on `device` without a stream sync: from pinned memory (the caching host
    allocator keeps it until the copy is done), asynchronous on CUDA. A pageable copy would wait for
    every kernel queued before it."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
