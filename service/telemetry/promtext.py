"""Prometheus text exposition: a streaming parser with precise errors, and a writer.

The parser accepts what VictoriaMetrics' /api/v1/import/prometheus accepts: comment and
TYPE/HELP lines, `name{labels} value [timestamp_ms]`, NaN and +/-Inf values. It caches
the parsed `name{labels}` prefix because import files repeat each series at many
timestamps; that cache is what keeps a million lines cheap. Parsed prefixes are also kept
process-wide, because pushes repeat the same series every poll.

`iter_blocks` reads a byte stream in blocks of whole lines: a block whose every line is
`name{labels} value ts_ms` is parsed as columns (numpy arrays), without a Python step per
line; any other block goes line by line through `iter_samples`, which gives the same
result and names the first bad line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from service.telemetry.samples import Sample

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\Z)')
# a label set without escapes or spaces, the usual case: one match, then findall
_PLAIN_BODY_RE = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\s]*",)*(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\s]*",?)?\Z')
_PLAIN_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# The shape `format_sample` writes: entity labels only, in its order, no escapes. A text of this
# shape is a valid series as it stands; the groups are the name and the label values.
CANONICAL_SERIES_RE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{device="([^"\\\n]*)"(?:,port="([^"\\\n]*)")?'
                                 r'(?:,lane="([0-9]{1,5})")?(?:,priority="([0-9]{1,5})")?(?:,gpu="([0-9]{1,5})")?\}')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r"\\[\\\"n]")
_SPECIAL_VALUES = {"NaN": math.nan, "+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf}
MAX_LINE_BYTES = 64 * 1024
_CACHE_LIMIT = 1_000_000
# `name{labels}` text -> (name, labels), shared by every stream of this process (pure syntax);
# emptied when full (~0.5 KB an entry): a 4,096-GPU fabric has ~410k series
_PARSED: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
SHARED_CACHE_LIMIT = 500_000


class PromParseError(ValueError):
    """A malformed or refused line (ingest also refuses timestamps that are not in milliseconds).
    `line` is 1-based; the message names the line and the reason."""

    def __init__(self, line: int, reason: str, source: str = "body") -> None:
        self.line, self.reason, self.source = line, reason, source
        super().__init__(f"{source}:{line}: {reason}")


@dataclass(frozen=True, slots=True)
class PromLine:
    line: int
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    ts_ms: int | None
    series: str = ""  # the raw `name{labels}` text; equal text means the same series


def _unescape(v: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], v) if "\\" in v else v


def _parse_series(series: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Parse `name{a="b",...}`; raises ValueError with the reason."""
    brace = series.find("{")
    if brace == -1:
        name, body = series, None
    else:
        if not series.endswith("}"):
            raise ValueError("label set is not closed with '}'")
        name, body = series[:brace], series[brace + 1 : -1]
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid metric name {name!r}")
    if not body or not body.strip():
        return name, ()
    if _PLAIN_BODY_RE.match(body):
        plain = tuple(_PLAIN_LABEL_RE.findall(body))
        if len({k for k, _ in plain}) == len(plain):
            return name, plain
    labels: list[tuple[str, str]] = []
    pos, seen = 0, set()
    while pos < len(body):
        m = _LABEL_RE.match(body, pos)
        if m is None:
            raise ValueError(f"malformed label set near {body[pos:pos + 30]!r}")
        key = m.group(1)
        if key in seen:
            raise ValueError(f"label {key!r} repeats")
        seen.add(key)
        labels.append((key, _unescape(m.group(2))))
        pos = m.end()
        if m.group(3) == "" or body[pos:].strip() == "":
            break
    return name, tuple(labels)


def _parse_value(tok: str) -> float:
    special = _SPECIAL_VALUES.get(tok)
    if special is not None:
        return special
    try:
        return float(tok)
    except ValueError:
        raise ValueError(f"value {tok!r} is not a number") from None


class ParsedSeries:
    """A parsed `name{labels}`; one object per distinct series text of a stream."""

    __slots__ = ("labels", "name")

    def __init__(self, name: str, labels: tuple[tuple[str, str], ...]) -> None:
        self.name, self.labels = name, labels


# What `iter_samples` yields per sample line: the raw `name{labels}` text, its parsed form,
# the value, the timestamp (None if absent) and the 1-based line number.
PromSample = tuple[str, ParsedSeries, float, int | None, int]


def iter_samples(lines: Iterable[str], source: str = "body", first_line: int = 1) -> Iterator[PromSample]:
    """Yield one PromSample per sample line; raise PromParseError at the first bad line.

    The common shape `name{labels} value [ts]` of an already-seen series (in this stream or,
    through `_PARSED`, in this process) takes one rsplit and the number conversions. It is
    only taken when its result is the one the full parser gives: the series text is a
    cached, valid one (a cut inside a quoted label value is never valid), the value and
    timestamp convert, and the line is not over-long. Anything else goes through
    `_parse_line`, which also produces the precise error.
    """
    cache: dict[str, ParsedSeries] = {}
    for lineno, raw in enumerate(lines, first_line):
        parts = raw.rsplit(" ", 2)
        parsed = cache.get(parts[0])
        if parsed is None and len(cache) < _CACHE_LIMIT:
            known = _PARSED.get(parts[0])
            if known is not None:
                parsed = cache[parts[0]] = ParsedSeries(*known)
        if parsed is not None and len(raw) <= MAX_LINE_BYTES:
            try:
                value = float(parts[1])
                ts_ms = int(parts[2]) if len(parts) == 3 else None
            except (ValueError, IndexError):
                pass
            else:
                yield parts[0], parsed, value, ts_ms, lineno
                continue
        sample = _parse_line(raw, lineno, source, cache)
        if sample is not None:
            yield sample


def _parse_line(raw: str, lineno: int, source: str, cache: dict[str, ParsedSeries]) -> PromSample | None:
    """Parse one line in full: None for blank and comment lines, PromParseError if malformed."""
    if len(raw) > MAX_LINE_BYTES:
        raise PromParseError(lineno, f"line longer than {MAX_LINE_BYTES} bytes", source)
    line = raw.strip()
    if not line or line[0] == "#":
        return None
    brace, space = line.find("{"), line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        end = line.rfind("}")
        if end == -1:
            raise PromParseError(lineno, "label set is not closed with '}'", source)
        series, rest = line[: end + 1], line[end + 1 :]
    elif space == -1:
        raise PromParseError(lineno, "missing value after the metric name", source)
    else:
        series, rest = line[:space], line[space:]
    parsed = cache.get(series)
    if parsed is None:
        try:
            known = parse_series(series)
        except ValueError as exc:
            raise PromParseError(lineno, str(exc), source) from None
        parsed = ParsedSeries(*known)
        if len(cache) < _CACHE_LIMIT:
            cache[series] = parsed
    parts = rest.split()
    if not parts:
        raise PromParseError(lineno, "missing value", source)
    if len(parts) > 2:
        raise PromParseError(lineno, f"unexpected text after the timestamp: {parts[2]!r}", source)
    try:
        value = _parse_value(parts[0])
    except ValueError as exc:
        raise PromParseError(lineno, str(exc), source) from None
    ts_ms: int | None = None
    if len(parts) == 2:
        try:
            ts_ms = int(parts[1])
        except ValueError:
            raise PromParseError(lineno, f"timestamp {parts[1]!r} is not integer milliseconds",
                                 source) from None
    return series, parsed, value, ts_ms, lineno


def parse_series(series: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """`name{labels}` text -> (name, labels), through the process-wide cache; ValueError if malformed."""
    known = _PARSED.get(series)
    if known is None:
        known = _parse_series(series)
        if len(_PARSED) >= SHARED_CACHE_LIMIT:
            _PARSED.clear()
        _PARSED[series] = known
    return known


class StreamTexts:
    """The distinct `name{labels}` texts of one stream's blocks so far, all valid, in order of first
    appearance. The stream's PromBlocks share `texts` (their codes index into it); it is only ever
    appended to, so a consumer maps each text once however many blocks repeat it."""

    __slots__ = ("_positions", "arrow", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._positions: dict[str, int] = {}
        self.arrow: object = None  # the texts as an Arrow array, kept by `arrow_columns`

    def positions(self) -> dict[str, int]:
        """text -> index in `texts`, brought up to date."""
        p = self._positions
        if len(p) < len(self.texts):
            p.update(zip(self.texts[len(p):], range(len(p), len(self.texts)), strict=True))
        return p


@dataclass(frozen=True, slots=True)
class PromBlock:
    """Consecutive sample lines, all `name{labels} value ts_ms` with a valid series, as columns."""

    first_line: int  # 1-based number of the block's first line
    texts: list[str]  # the stream's texts (`StreamTexts.texts`): shared by its blocks, only appended to
    codes: np.ndarray  # int32 per line: its text's index in `texts`
    values: np.ndarray  # float64
    ts_ms: np.ndarray  # int64
    lines: np.ndarray | None = None  # each line's number, where they are not consecutive (a block split by shard)

    def line_numbers(self, rows: np.ndarray) -> np.ndarray:
        """The 1-based line numbers of these rows of the block."""
        return rows + self.first_line if self.lines is None else self.lines[rows]

    @property
    def series(self) -> list[str]:
        """The `name{labels}` text of each line."""
        return [self.texts[c] for c in self.codes.tolist()]


BLOCK_BYTES = 32 << 20
ARROW_FROM_BYTES = 256 << 10  # smaller blocks (pushes) are split in Python: Arrow's cost per call is more
# series texts found valid, process-wide like `_PARSED` (pushes repeat them), emptied when full
_VALID_TEXTS: set[str] = set()
FIRST_BLOCK_BYTES = 1 << 20
# What a block reader gives: the series texts new to the stream, each line's index into the stream's
# texts, values, timestamps, and the new texts not of the canonical shape (None: not checked).
Columns = tuple[list[str], np.ndarray, np.ndarray, np.ndarray, list[str] | None]


def iter_blocks(chunks: Iterable[bytes], source: str = "body",
                block_bytes: int = BLOCK_BYTES) -> Iterator[PromBlock | PromSample]:
    """Parse a UTF-8 byte stream: a PromBlock per block of whole lines in the common shape,
    else one PromSample per sample line of the block. Raises PromParseError at the first bad
    line and UnicodeDecodeError if the stream is not UTF-8."""
    lineno = 1
    known = StreamTexts()
    for data in _whole_lines(chunks, block_bytes):
        block = _parse_block(data, lineno, known)
        if block is not None:
            yield block
            lineno += len(block.codes)  # a line each (only the stream's last block may lack a final newline)
        else:
            yield from iter_samples(data.decode("utf-8").split("\n"), source, lineno)
            lineno += data.count(b"\n")


def _whole_lines(chunks: Iterable[bytes], block_bytes: int) -> Iterator[bytes]:
    """Regroup chunks into blocks that end at a line end (the last may not): the first of about
    1 MiB, each next twice as large up to `block_bytes`. Large blocks cost the least per line;
    a small first one lets the consumer start (creating series) sooner."""
    parts: list[bytes] = []
    held = 0
    size = min(block_bytes, FIRST_BLOCK_BYTES)
    for chunk in chunks:
        parts.append(chunk)
        held += len(chunk)
        if held >= size:
            size = min(block_bytes, 2 * size)
            cut = chunk.rfind(b"\n") + 1
            if cut:  # cut in the newest chunk: the rest is copied once, by the join
                parts[-1] = chunk[:cut]
                yield b"".join(parts)
                parts = [chunk[cut:]] if cut < len(chunk) else []
                held = len(chunk) - cut
                continue
            pending = b"".join(parts)
            cut = pending.rfind(b"\n") + 1
            if not cut and len(pending) > MAX_LINE_BYTES:
                cut = len(pending)  # part of an over-long line, which the line parser refuses
            if cut:
                yield pending[:cut] if cut < len(pending) else pending
            parts = [pending[cut:]] if cut < len(pending) else []
            held = len(pending) - cut
    if held:
        yield b"".join(parts)


def _parse_block(data: bytes, first_line: int, known: StreamTexts) -> PromBlock | None:
    """Columns if every line is exactly `series value ts` (two single spaces, no carriage return,
    not over-long, a valid series, numbers read as `iter_samples` reads them); else None.

    Large blocks are read by Arrow's CSV reader (space-separated, no quoting), which does in C++
    what would otherwise be a Python step per line. It is used only where its reading is
    `iter_samples`' own: every line has exactly three fields, Arrow's number parsing refuses
    (and so sends to the line parser) every form `float` and `int` refuse except `nan(...)`,
    which is checked there. Each series text new to the stream is validated (`parse_series`,
    unless it has the canonical shape, which Arrow checks in C++, or was found valid before) and
    added to `known`."""
    if b"\r" in data or _has_long_line(data):  # "\r" ends a line to Arrow, not to the line parser
        return None
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if len(data) < ARROW_FROM_BYTES:
        columns = _split_columns(data, known)
    else:
        from service.telemetry import arrow_columns

        columns = arrow_columns.read(data, known)  # refuses any line without exactly three fields (two spaces)
    if columns is None or not lines or len(columns[1]) != lines:
        return None
    new, codes, values, ts_ms, unshaped = columns
    canonical = CANONICAL_SERIES_RE.fullmatch
    try:
        for s in new if unshaped is None else unshaped:
            if s not in _VALID_TEXTS and s not in _PARSED and canonical(s) is None:
                parse_series(s)
    except ValueError:
        return None
    if len(_VALID_TEXTS) + len(new) > SHARED_CACHE_LIMIT:
        _VALID_TEXTS.clear()
    _VALID_TEXTS.update(new)
    known.texts.extend(new)
    return PromBlock(first_line, known.texts, codes, values, ts_ms)


def _has_long_line(data: bytes) -> bool:
    """Whether a line (with its newline) is longer than MAX_LINE_BYTES. A quick pass first: if every
    aligned half of that length holds a newline, none is, as a longer line holds a whole half."""
    half = MAX_LINE_BYTES // 2
    if all(data.find(b"\n", i, i + half) != -1 for i in range(0, len(data) - half + 1, half)):
        return False
    return bool(np.diff(_line_ends(data), prepend=-1).max() > MAX_LINE_BYTES)


def _line_ends(data: bytes) -> np.ndarray:
    """The offset of each line's end: its newline, or the end of the data."""
    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    return ends if data.endswith(b"\n") else np.append(ends, len(data))


def _split_columns(data: bytes, known: StreamTexts) -> Columns | None:
    """`arrow_columns.read` for small blocks, split in Python: numbers are read by `float` and
    `int` themselves, and the shape of series texts is left to the caller (None for the last
    item); None unless every line has two single spaces."""
    ends = _line_ends(data)
    spaces = np.flatnonzero(np.frombuffer(data, np.uint8) == 32)
    if len(spaces) != 2 * len(ends) or (np.diff(np.searchsorted(spaces, ends), prepend=0) != 2).any():
        return None
    tokens = data.decode("utf-8").replace("\n", " ").split(" ")
    if data.endswith(b"\n"):
        tokens.pop()  # after the last newline
    series = tokens[0::3]
    try:
        values = np.fromiter(map(float, tokens[1::3]), np.float64, len(series))
        ts_ms = np.fromiter(map(int, tokens[2::3]), np.int64, len(series))
    except (ValueError, OverflowError):
        return None
    texts = list(dict.fromkeys(series))  # of this block
    local = dict(zip(texts, range(len(texts)), strict=True))
    codes = np.fromiter(map(local.__getitem__, series), np.int32, len(series))
    if not known.texts:  # the stream's first block (a push's only one): its texts are the stream's
        return texts, codes, values, ts_ms, None
    stream = known.positions()
    new = [t for t in texts if t not in stream]
    at = dict(zip(new, range(len(known.texts), len(known.texts) + len(new)), strict=True))
    in_stream = np.fromiter((stream[t] if t in stream else at[t] for t in texts), np.int32, len(texts))
    return new, in_stream[codes], values, ts_ms, None


def parse_lines(lines: Iterable[str], source: str = "body") -> Iterator[PromLine]:
    """Yield one PromLine per sample line; raise PromParseError at the first bad line."""
    for series, parsed, value, ts_ms, lineno in iter_samples(lines, source):
        yield PromLine(lineno, parsed.name, parsed.labels, value, ts_ms, series)


def parse_text(text: str, source: str = "body") -> list[PromLine]:
    return list(parse_lines(text.splitlines(), source))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() or abs(v) >= 1e16 else str(int(v))


def format_sample(s: Sample) -> str:
    """One exposition line for a Sample, with its timestamp."""
    labels = [f'device="{_escape(s.device)}"']
    if s.port is not None:
        labels.append(f'port="{_escape(s.port)}"')
    if s.lane is not None:
        labels.append(f'lane="{s.lane}"')
    if s.priority is not None:
        labels.append(f'priority="{s.priority}"')
    if s.gpu is not None:
        labels.append(f'gpu="{s.gpu}"')
    return f"{s.metric}{{{','.join(labels)}}} {_fmt_value(s.value)} {s.ts_ms}"


def write_samples(samples: Iterable[Sample], out: IO[str]) -> int:
    """Write samples as exposition lines; returns how many were written."""
    n = 0
    for s in samples:
        out.write(format_sample(s))
        out.write("\n")
        n += 1
    return n
