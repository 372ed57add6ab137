"""Reading safetensors checkpoints (single, sharded; f32, f16, bf16) into float32."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file as save_numpy

from inferd.engine.reference.weights import Checkpoint, WeightsError


def test_bf16_tensors_upcast_exactly_to_float32(tmp_path: Path):
    torch = pytest.importorskip("torch")     # writes the bf16 reference; in the `parity` extra
    from safetensors.torch import save_file as save_torch

    values = torch.randn(5, 7).to(torch.bfloat16)
    save_torch({"w": values}, str(tmp_path / "model.safetensors"))

    got = Checkpoint(tmp_path).get("w")

    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values.float().numpy())


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_numpy_float_tensors_read_as_float32(tmp_path: Path, dtype):
    values = np.random.default_rng(0).standard_normal((3, 4)).astype(dtype)
    save_numpy({"w": values}, str(tmp_path / "model.safetensors"))

    got = Checkpoint(tmp_path).get("w", shape=(3, 4))

    assert got.dtype == np.float32 and got.flags.writeable
    np.testing.assert_array_equal(got, values.astype(np.float32))


def test_sharded_checkpoint_reads_tensors_from_every_shard(tmp_path: Path):
    save_numpy({"a": np.ones((2,), np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_numpy({"b": np.full((3,), 2.0, np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                        "b": "model-00002-of-00002.safetensors"}}))

    checkpoint = Checkpoint(tmp_path)

    assert sorted(checkpoint) == ["a", "b"]
    assert checkpoint.get("b").tolist() == [2.0, 2.0, 2.0]


def test_tensor_in_two_shards_is_rejected(tmp_path: Path):
    save_numpy({"a": np.ones((2,), np.float32)}, str(tmp_path / "one.safetensors"))
    save_numpy({"a": np.ones((2,), np.float32)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(WeightsError, match="'a' appears in both"):
        Checkpoint(tmp_path)


def test_missing_tensor_error_names_it(tmp_path: Path):
    save_numpy({"a": np.ones((2,), np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match="no tensor 'lm_head.weight'"):
        Checkpoint(tmp_path).get("lm_head.weight")


def test_shape_mismatch_error_names_tensor_and_shapes(tmp_path: Path):
    save_numpy({"a": np.ones((2, 3), np.float32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"'a' has shape \(2, 3\), the config implies \(3, 2\)"):
        Checkpoint(tmp_path).get("a", shape=(3, 2))


def test_unsupported_dtype_error_names_it(tmp_path: Path):
    save_numpy({"ids": np.arange(4, dtype=np.int64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match="dtype I64"):
        Checkpoint(tmp_path).get("ids")


def test_directory_without_safetensors_is_rejected(tmp_path: Path):
    with pytest.raises(WeightsError, match="no \\*.safetensors"):
        Checkpoint(tmp_path)


def test_truncated_file_is_rejected(tmp_path: Path):
    path = tmp_path / "model.safetensors"
    save_numpy({"a": np.ones((64,), np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-16])
    with pytest.raises(WeightsError, match="outside the file"):
        Checkpoint(tmp_path)


def test_header_length_beyond_the_file_is_rejected(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(WeightsError, match="header length"):
        Checkpoint(tmp_path)
