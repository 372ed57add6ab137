"""Reads HF checkpoints stored as safetensors (single file or sharded) into float32 NumPy arrays.

The safetensors format is parsed directly (an 8-byte header length, a JSON header, raw little-endian
tensor bytes) over a read-only mmap: NumPy has no bfloat16, so safetensors.numpy cannot load the
bf16 checkpoints most Llama models ship in. bf16 is upcast exactly by shifting into the high half of
a float32; f16/f64 are cast. Tensors are converted one at a time, on request, so loading a model
costs its float32 size plus one tensor, not twice the checkpoint.
"""
from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2"),
           "I8": np.dtype("i1")}
SCALE_SUFFIX = "_scale"     # an int8 weight's per-output-channel float32 scales (inferd.engine.reference.int8)


class WeightsError(Exception):
    """A checkpoint file is missing, malformed, or lacks a tensor the model needs."""


class _TensorInfo:
    __slots__ = ("file", "dtype", "shape", "begin", "end")

    def __init__(self, file: "_SafetensorsFile", dtype: str, shape: tuple[int, ...], begin: int, end: int):
        self.file, self.dtype, self.shape, self.begin, self.end = file, dtype, shape, begin, end


class _SafetensorsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as fh:
                size = path.stat().st_size
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        except OSError as exc:
            raise WeightsError(f"cannot open {path}: {exc}") from exc
        if self._mmap is None or size < 8:
            raise WeightsError(f"{path}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", self._mmap[:8])
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise WeightsError(f"{path}: header length {header_len} does not fit the file")
        try:
            header = json.loads(self._mmap[8:8 + header_len])
        except ValueError as exc:
            raise WeightsError(f"{path}: header is not JSON: {exc}") from exc
        self.data_start = 8 + header_len
        self.tensors: dict[str, _TensorInfo] = {}
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = (int(x) for x in meta["data_offsets"])
                info = _TensorInfo(self, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]), begin, end)
            except (KeyError, TypeError, ValueError) as exc:
                raise WeightsError(f"{path}: bad header entry for tensor {name!r}") from exc
            if not 0 <= begin <= end <= size - self.data_start:
                raise WeightsError(f"{path}: tensor {name!r} data_offsets lie outside the file")
            self.tensors[name] = info

    def read(self, name: str, info: _TensorInfo) -> np.ndarray:
        dtype = _DTYPES.get(info.dtype)
        if dtype is None:
            raise WeightsError(f"{self.path}: tensor {name!r} has dtype {info.dtype}; "
                               f"supported: {', '.join(_DTYPES)}")
        count = int(np.prod(info.shape, dtype=np.int64))
        if (info.end - info.begin) != count * dtype.itemsize:
            raise WeightsError(f"{self.path}: tensor {name!r} byte size does not match shape {info.shape}")
        raw = np.frombuffer(self._mmap, dtype=dtype, count=count, offset=self.data_start + info.begin)
        if info.dtype == "I8":
            return raw.copy().reshape(info.shape)        # quantized: read as it is, with its scales
        if info.dtype == "BF16":
            out = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out = raw.astype(np.float32)    # copies: the result never aliases the mmap
        return out.reshape(info.shape)


class Checkpoint:
    """The tensors of one HF model directory, read lazily as float32."""

    def __init__(self, directory: Path, files: list[Path] | None = None) -> None:
        """Every *.safetensors in `directory` (or the shards its index names); `files`: exactly those."""
        directory = Path(directory)
        self.directory = directory
        index = directory / "model.safetensors.index.json"
        if files is not None:
            files = [Path(f) for f in files]
        elif index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                shard_names = sorted(set(weight_map.values()))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise WeightsError(f"{index}: not a safetensors index (needs a 'weight_map' object)") from exc
            files = [directory / name for name in shard_names]
        else:
            files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise WeightsError(f"{directory}: no *.safetensors files")
        self._tensors: dict[str, _TensorInfo] = {}
        for path in files:
            for name, info in _SafetensorsFile(path).tensors.items():
                if name in self._tensors:
                    raise WeightsError(f"tensor {name!r} appears in both {self._tensors[name].file.path.name} "
                                       f"and {path.name}")
                self._tensors[name] = info

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name).shape

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor `name` as a new float32 array; `shape`, if given, is checked. An int8 weight is refused
        here (`quantized` says which are; `get_int8` reads them): read as float it would be wrong."""
        info = self._info(name)
        if shape is not None and info.shape != tuple(shape):
            raise WeightsError(f"tensor {name!r} has shape {info.shape}, the config implies {tuple(shape)}")
        if info.dtype == "I8":
            raise WeightsError(f"{self.directory}: tensor {name!r} is int8-quantized; this engine reads float "
                               f"weights only")
        return info.file.read(name, info)

    def quantized(self, name: str) -> bool:
        """Whether weight `name` is stored int8 with per-row scales (`name` + SCALE_SUFFIX)."""
        return self._info(name).dtype == "I8"

    def get_int8(self, name: str, shape: tuple[int, int]):
        """Int8 weight `name` [out, in] and its scales, as an Int8Matrix."""
        from inferd.engine.reference.int8 import Int8Matrix

        info = self._info(name)
        if info.shape != tuple(shape):
            raise WeightsError(f"tensor {name!r} has shape {info.shape}, the config implies {tuple(shape)}")
        scale = self._info(name + SCALE_SUFFIX)
        if scale.dtype != "F32" or scale.shape != (shape[0],):
            raise WeightsError(f"{self.directory}: {name + SCALE_SUFFIX!r} must be float32 [{shape[0]}]")
        return Int8Matrix(info.file.read(name, info), scale.file.read(name + SCALE_SUFFIX, scale))

    def _info(self, name: str) -> _TensorInfo:
        try:
            return self._tensors[name]
        except KeyError:
            raise WeightsError(f"{self.directory}: checkpoint has no tensor {name!r}") from None
