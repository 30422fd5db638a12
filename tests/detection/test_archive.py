"""The detector state's container (service/detection/archive.py): each member compressed on its own, by size."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from service.detection.archive import SMALL, Archive, pack


def test_members_round_trip_each_compressed_by_its_size_and_plain_ones_as_they_are() -> None:
    rng = np.random.default_rng(3)
    arrays = {"big|zeros": np.zeros((4096, 8), np.float32), "small": np.arange(10, dtype=np.int64),
              "floats": rng.normal(size=(3000, 6)), "names": np.asarray(["leaf-1", "spine-2"]),
              "empty": np.zeros((0, 5), np.uint8), "fortran": np.asfortranarray(rng.integers(0, 9, (64, 300)))}
    blob = pack(arrays, plain={"floats"})
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        kinds = {i.filename: (i.compress_type, i.compress_size) for i in z.infolist()}
    assert kinds["big|zeros.npy.zst"][0] == zipfile.ZIP_STORED and kinds["big|zeros.npy.zst"][1] < SMALL // 8
    assert kinds["fortran.npy.zst"][0] == zipfile.ZIP_STORED
    assert kinds["small.npy"][0] == kinds["names.npy"][0] == kinds["empty.npy"][0] == zipfile.ZIP_DEFLATED
    assert kinds["floats.npy"][0] == zipfile.ZIP_STORED and kinds["floats.npy"][1] > 3000 * 6 * 8
    with Archive(blob) as z:
        assert sorted(z.files) == sorted(arrays) and "small" in z and "nothing" not in z
        for key, a in arrays.items():
            got = z[key]
            assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
            got[...] = got  # writable, as np.load's arrays are: a restored state is changed in place


def test_an_npz_an_earlier_release_stored_is_read() -> None:
    arrays = {"a": np.arange(50_000, dtype=np.int64), "b": np.asarray([1.5, np.nan])}
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, **arrays)
        with Archive(buf.getvalue()) as z:
            assert sorted(z.files) == ["a", "b"]
            assert np.array_equal(z["a"], arrays["a"]) and np.array_equal(z["b"], arrays["b"], equal_nan=True)


def test_a_damaged_blob_is_an_error_not_a_state() -> None:
    blob = pack({"a": np.arange(50_000, dtype=np.int64)})
    with pytest.raises(zipfile.BadZipFile):
        Archive(blob[: len(blob) // 2])
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32 for file 'a.npy.zst'"):  # the member, named
        Archive(blob.replace(blob[200:240], bytes(40)))["a"]
