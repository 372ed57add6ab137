"""HostUpload: named host arrays arrive on the device with their dtypes, shapes and values, from one buffer."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inferd.engine.torch.upload import HostUpload


def test_arrays_of_every_dtype_arrive_with_their_shapes_and_values():
    arrays = {"ids": np.arange(5, dtype=np.int64), "flags": np.array([True, False, True]),
              "bits": np.arange(12, dtype=np.uint8).reshape(3, 4), "half": np.array([1.5, -2.0], dtype=np.float32),
              "wide": np.array([0.1, 1e300]), "small": np.array([7], dtype=np.int32), "none": np.zeros(0, np.int64)}
    got = HostUpload("cpu").send(arrays)
    assert list(got) == list(arrays)
    for name, array in arrays.items():
        assert got[name].dtype == torch.from_numpy(array).dtype and tuple(got[name].shape) == array.shape
        assert np.array_equal(got[name].numpy(), array)


def test_a_later_send_leaves_earlier_tensors_intact_and_grows_its_buffer():
    upload = HostUpload("cpu")
    first = upload.send({"a": np.arange(4, dtype=np.int64)})
    second = upload.send({"b": np.full(10_000, 3, dtype=np.int64), "c": np.ones(3, dtype=np.float32)})
    assert first["a"].tolist() == [0, 1, 2, 3]
    assert second["b"].sum().item() == 30_000 and second["c"].tolist() == [1.0, 1.0, 1.0]


def test_an_array_of_an_unsupported_dtype_is_refused():
    with pytest.raises(TypeError):
        HostUpload("cpu").send({"text": np.array(["a"])})
