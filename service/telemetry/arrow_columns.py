"""Arrow's CSV reader for blocks of plain exposition lines (`promtext._parse_block` decides which).

Imported only when a block is read: collectors and CLI commands that never parse exposition
text do not pay for loading Arrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

_PARSE = pa_csv.ParseOptions(delimiter=" ", quote_char=False, escape_char=False, newlines_in_values=False,
                             ignore_empty_lines=False)
# values as text first: a NaN has to be checked against its text (see `read`)
_CONVERT = pa_csv.ConvertOptions(column_types={"series": pa.string(), "value": pa.string(), "ts": pa.int64()},
                                 null_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False)
_THREADS_FROM_BYTES = 1 << 20  # below this, starting threads costs more than it saves


def read(data: bytes) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray] | None:
    """(distinct series texts in order of first appearance, int32 index into them per line, float64
    values, int64 timestamps) of lines of exactly three space-separated fields; None if Arrow
    refuses a field (not UTF-8, a number it does not read) or reads one as `float` would not."""
    options = pa_csv.ReadOptions(column_names=["series", "value", "ts"],
                                 use_threads=len(data) >= _THREADS_FROM_BYTES)
    try:
        table = pa_csv.read_csv(pa.py_buffer(data), read_options=options, parse_options=_PARSE,
                                convert_options=_CONVERT)
        text_values = table.column("value")
        values = pc.cast(text_values, pa.float64()).to_numpy()
    except pa.ArrowInvalid:
        return None
    nan = np.isnan(values)
    if nan.any():  # Arrow also reads `nan(...)`, which `float` refuses
        try:
            for token in pc.filter(text_values, pa.array(nan)).to_pylist():
                float(token)
        except ValueError:
            return None
    encoded = table.column("series").combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    ts_ms = table.column("ts").to_numpy()
    return encoded.dictionary.to_pylist(), codes, values, ts_ms
