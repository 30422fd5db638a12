"""The stored detector state's container: a zip of `.npy` members, each compressed on its own.

A member is read without the others (the API's coverage reads two arrays of a state that is hundreds of MB
at 300k ports). A member of 16 KiB or more is compressed with zstd at level 1: as small as deflate at level 1,
about 5x faster (docs/benchmarks.md, 2026-12-06), and the save is a live cycle's largest part at scale. Smaller
members are deflated by the zip, and those listed as plain (measured floats that no compressor shrinks much)
are stored as they are. States stored before 2026-12-06 (an npz of deflated members) are read as well.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterable, Mapping
from types import TracebackType

import cramjam
import numpy as np

ZSTD = ".npy.zst"
PLAIN = ".npy"
SMALL = 16 * 1024  # bytes of .npy: a smaller member is deflated (below)


def pack(arrays: Mapping[str, np.ndarray], plain: Iterable[str] = ()) -> bytes:
    """The arrays as an archive, by name: those in `plain` uncompressed, small ones deflated by the zip itself
    (a zstd call has a fixed cost of ~20 us, a deflate ~3 us: most members of a small fabric's state are a few
    hundred bytes), the rest zstd-compressed."""
    plain = set(plain)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1, allowZip64=True) as zf:
        for key, a in arrays.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, np.asanyarray(a), allow_pickle=False)
            member: str | zipfile.ZipInfo
            data: memoryview | cramjam.Buffer
            if key in plain:
                member, data = _stored(f"{key}{PLAIN}"), npy.getbuffer()
            elif npy.tell() < SMALL:
                member, data = f"{key}{PLAIN}", npy.getbuffer()  # by name: the zip's deflate, at its level
            else:
                member, data = _stored(f"{key}{ZSTD}"), cramjam.zstd.compress(npy.getbuffer(), level=1)
            with zf.open(member, "w", force_zip64=True) as f:
                f.write(data)
    return buf.getvalue()


def _stored(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_STORED
    return info


class Archive:
    """An archive's arrays by name, each read and decompressed when asked for (like np.load's NpzFile)."""

    def __init__(self, data: bytes | memoryview) -> None:
        self._zip = zipfile.ZipFile(io.BytesIO(data))
        self._members = {n.removesuffix(ZSTD).removesuffix(PLAIN): n for n in self._zip.namelist()}
        self.files = list(self._members)

    def __contains__(self, key: str) -> bool:
        return key in self._members

    def __getitem__(self, key: str) -> np.ndarray:
        name = self._members[key]
        raw: bytes | cramjam.Buffer = self._zip.read(name)
        if name.endswith(ZSTD):
            raw = cramjam.zstd.decompress(raw)
        return np.lib.format.read_array(io.BytesIO(memoryview(raw)), allow_pickle=False)

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
