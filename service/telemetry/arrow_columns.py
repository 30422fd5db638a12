"""Arrow's CSV reader for blocks of plain exposition lines (`promtext._parse_block` decides which).

Imported only when a block is read: collectors and CLI commands that never parse exposition
text do not pay for loading Arrow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from service.telemetry.promtext import CANONICAL_SERIES_RE

if TYPE_CHECKING:
    from service.telemetry.promtext import Columns, StreamTexts

# The C library's allocator: each block's columns are freed before the next is read, and glibc
# reuses that memory where mimalloc (Arrow's default) returned it, to be faulted in again: an import
# of 1M lines ran ~0.2 s faster (docs/benchmarks.md).
pa.set_memory_pool(pa.system_memory_pool())

_PARSE = pa_csv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False, newlines_in_values=False,
                             ignore_empty_lines=False)


def _convert(value_type: pa.DataType) -> pa_csv.ConvertOptions:
    return pa_csv.ConvertOptions(column_types={"series": pa.string(), "value": value_type, "ts": pa.int64()},
                                 null_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False)


_CONVERT = _convert(pa.float64())
_CONVERT_TEXT_VALUES = _convert(pa.string())
_THREADS_FROM_BYTES = 1 << 20  # below this, starting threads costs more than it saves
_CANONICAL = f"^(?:{CANONICAL_SERIES_RE.pattern})$"  # the same pattern, matched by RE2


def read(data: bytes | bytearray, known: StreamTexts) -> Columns | None:
    """(series texts new to `known`, in order of first appearance; int32 index per line into `known`'s
    texts followed by the new ones; float64 values; int64 timestamps; the new texts not of the
    canonical shape) of lines of exactly three space-separated fields; None if Arrow refuses a field
    (not UTF-8, a number it does not read) or reads one as `float` would not. Texts `known` has are
    found in C++ (a hash lookup against the stream's texts), so a block of known series makes no
    Python object per line or per series."""
    table = _read_csv(data, _CONVERT)
    if table is None:
        return None
    values = table.column("value").to_numpy()
    if np.isnan(values).any() and not _nans_read_as_float_reads(data, np.isnan(values)):
        return None
    series = table.column("series")
    if known.texts:
        found = pc.index_in(series, value_set=_known_array(known))
        missing = found.is_null()
        unknown = pc.filter(series, missing).combine_chunks() if found.null_count else None
        codes = found.fill_null(-1).to_numpy().astype(np.int32)  # a writable copy
    else:
        unknown, codes, missing = series.combine_chunks(), None, None
    new: list[str] = []
    unshaped: list[str] = []
    if unknown is not None and len(unknown):
        encoded = unknown.dictionary_encode()
        new_codes = encoded.indices.to_numpy(zero_copy_only=False) + len(known.texts)
        if codes is None:
            codes = new_codes.astype(np.int32, copy=False)
        else:
            codes[missing.to_numpy(zero_copy_only=False)] = new_codes
        new = encoded.dictionary.to_pylist()
        shaped = pc.match_substring_regex(encoded.dictionary, _CANONICAL)
        if shaped.false_count:
            unshaped = pc.filter(encoded.dictionary, pc.invert(shaped)).to_pylist()
    return new, codes, values, table.column("ts").to_numpy(), unshaped


def _read_csv(data: bytes | bytearray, convert: pa_csv.ConvertOptions) -> pa.Table | None:
    options = pa_csv.ReadOptions(column_names=["series", "value", "ts"],
                                 use_threads=len(data) >= _THREADS_FROM_BYTES)
    try:
        return pa_csv.read_csv(pa.py_buffer(data), read_options=options, parse_options=_PARSE, convert_options=convert)
    except pa.ArrowInvalid:
        return None


def _nans_read_as_float_reads(data: bytes | bytearray, nan: np.ndarray) -> bool:
    """Whether every value Arrow read as NaN is one `float` reads: Arrow also takes `nan(...)`. The
    block is read again for the values' text, which only a block with NaNs pays for."""
    table = _read_csv(data, _CONVERT_TEXT_VALUES)
    if table is None:
        return False
    try:
        for token in pc.filter(table.column("value"), pa.array(nan)).to_pylist():
            float(token)
    except ValueError:
        return False
    return True


def _known_array(known: StreamTexts) -> pa.Array:
    """`known`'s texts as one Arrow array (positions as in the list), kept on it and extended by
    the texts added since."""
    have: pa.Array | None = known.arrow
    size = 0 if have is None else len(have)
    if size < len(known.texts):
        more = pa.array(known.texts[size:], pa.string())
        known.arrow = more if have is None else pa.concat_arrays([have, more])
    return known.arrow
