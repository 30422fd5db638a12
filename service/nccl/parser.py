"""Parse nccl-tests text output (`*_perf`) into one NcclRun, or reject it with file, line and reason.

What a run must have to be accepted (a baseline built from a partial run would be wrong):
- the column header (`#  size  count  type  redop  root  time  algbw  busbw  #wrong ...`);
- at least one complete result row, with no size repeated;
- the `# Avg bus bandwidth` footer, which nccl-tests prints only after the last size;
- no `Test ... failure` line, and a rank list without an author's `...` elision.

Everything else is tolerated and kept as a warning: MPI noise and help boxes, NCCL INFO/WARN
lines interleaved anywhere, OpenMPI `--tag-output` prefixes, blank lines, trailing spaces,
`N/A` in `#wrong` (validation off, or in-place for alltoall/sendrecv) and `%g` notation in
`#wrong` (`1.04858e+06`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

# Collective binaries, longest first so "reduce_scatter" wins over "reduce".
TESTS = ("all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "alltoall_perf", "sendrecv_perf",
         "broadcast_perf", "reduce_perf", "gather_perf", "scatter_perf", "hypercube_perf")
_TEST_WORDS = sorted(((t[:-5], t) for t in TESTS), key=lambda x: -len(x[0]))

_TAG = re.compile(r"^\[\d+,\d+\]<(stdout|stderr|stddiag)>:")
_NCCL_LOG = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:\S+:\d+ )?"
                       r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (\S+)")
_TESTS_VERSION = re.compile(r"^# nccl-tests version (\S+)(?: nccl-headers=(\d+))?(?: nccl-library=(\d+))?")
_STARTING = re.compile(r"^# Collective test (starting|concluded): (\S+)")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                   r"\[([^\]]*)\]\s*(.*?)\s*$")
_FAILURE = re.compile(r"Test (?:NCCL |CUDA )?failure")
_ENV_SET = re.compile(r"^(NCCL_\w+) set by environment to (.*?)\.?$")
_ENV_ARG = re.compile(r"(?:^|\s)(?:-x\s+|--env\s+)?(NCCL_[A-Z0-9_]+)=(\S+)")
_COMMAND = re.compile(r"(\w+_perf)(?:_mpi)?\b")
_OOB = re.compile(r"^# Out of bounds values\s*:\s*(\d+)\s*(\w+)?")
_AVG = re.compile(r"^# Avg bus bandwidth\s*:\s*(\S+)")
_HEADER_KEYS = {
    "nThread": r"nThread (\d+)", "nGpus": r"nGpus (\d+)", "minBytes": r"minBytes (\d+)",
    "maxBytes": r"maxBytes (\d+)", "step": r"step: (\S+)", "warmup_iters": r"warmup iters: (\d+)",
    "iters": r"(?<!warmup )(?<!agg )iters: (\d+)", "agg_iters": r"agg iters: (\d+)",
    "validation": r"validation: (\d+)", "graph": r"graph: (\d+)", "unalign": r"unalign: (\d+)",
}


class NcclParseError(ValueError):
    """Rejected output: which file, which line (1-based; 0 for the whole file) and why."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{source}:{line}: {reason}")
        self.source, self.line, self.reason = source, line, reason


@dataclass(frozen=True, slots=True)
class Rank:
    rank: int
    group: int
    pid: int
    host: str
    device: int
    bus_id: str
    gpu_name: str


@dataclass(frozen=True, slots=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int | None
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None   # None: N/A (not validated)
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None
    line: int


@dataclass(slots=True)
class NcclRun:
    source: str
    test: str | None = None
    tests_version: str | None = None
    nccl_version: str | None = None
    command: str | None = None
    header: dict[str, str] = field(default_factory=dict)
    ranks: list[Rank] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    oob_status: str | None = None
    avg_busbw: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    nccl_warnings: list[str] = field(default_factory=list)
    digest: str = ""

    @property
    def hosts(self) -> list[str]:
        """Hosts in rank order, each once."""
        return list(dict.fromkeys(r.host for r in self.ranks))

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    @property
    def gpu_model(self) -> str | None:
        names = {r.gpu_name for r in self.ranks if r.gpu_name}
        return names.pop() if len(names) == 1 else None

    @property
    def wrong_total(self) -> int:
        return sum((r.oop_wrong or 0) + (r.ip_wrong or 0) for r in self.rows)

    @property
    def failed(self) -> bool:
        return self.wrong_total > 0 or (self.oob_status or "OK").upper() != "OK"


def _strip_tag(line: str) -> tuple[str, str | None]:
    m = _TAG.match(line)
    return (line[m.end():], m.group(1)) if m else (line, None)


def _num(tok: str, what: str) -> float:
    try:
        return float(tok)
    except ValueError:
        raise ValueError(f"{what} {tok!r} is not a number") from None


def _wrong(tok: str) -> int | None:
    if tok.upper() == "N/A":
        return None
    v = _num(tok, "#wrong")
    if v < 0 or v != v:
        raise ValueError(f"#wrong {tok!r} is not a count")
    return round(v)  # %g loses digits above 1e6 ("1.04858e+06"): the nearest integer is the best we have


def _columns(line: str) -> list[str] | None:
    """The column names if this is the table's column header line."""
    toks = line.lstrip("#").split()
    if len(toks) >= 8 and toks[0] == "size" and toks[1] == "count" and "busbw" in toks:
        return toks
    return None


def _row(toks: list[str], cols: list[str], line_no: int) -> NcclRow:
    if len(toks) != len(cols):
        raise ValueError(f"{len(toks)} fields where the header has {len(cols)} columns")
    has_root = "root" in cols
    i = 5 if has_root else 4
    try:
        size, count = int(toks[0]), int(toks[1])
    except ValueError:
        raise ValueError(f"size/count {toks[0]!r} {toks[1]!r} are not integers") from None
    root = int(_num(toks[4], "root")) if has_root else None
    oop = toks[i:i + 4]
    ip = toks[i + 4:i + 8]
    if len(ip) < 4:
        raise ValueError("the in-place columns are missing")
    return NcclRow(size, count, toks[2], toks[3], root,
                   _num(oop[0], "out-of-place time"), _num(oop[1], "out-of-place algbw"),
                   _num(oop[2], "out-of-place busbw"), _wrong(oop[3]),
                   _num(ip[0], "in-place time"), _num(ip[1], "in-place algbw"), _num(ip[2], "in-place busbw"),
                   _wrong(ip[3]), line_no)


def _test_from(text: str) -> str | None:
    low = text.lower()
    for word, test in _TEST_WORDS:
        if word in low or word.replace("_", "") in low.replace("-", "_").replace("_", ""):
            return test
    return None


def _version_from_code(code: str) -> str:
    n = int(code)  # NCCL_VERSION_CODE: major*10000 + minor*100 + patch
    return f"{n // 10000}.{n // 100 % 100}.{n % 100}"


def parse_nccl_tests(text: str, source: str = "<text>", *, test: str | None = None) -> NcclRun:
    """Parse one nccl-tests run; NcclParseError(source, line, reason) when it cannot be trusted."""
    run = NcclRun(source=source)
    cols: list[str] | None = None
    seen_sizes: dict[int, int] = {}
    in_devices = False
    footer_line = 0
    last_line = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line, stream = _strip_tag(raw.rstrip("\r"))
        stripped = line.strip()
        if not stripped:
            continue
        last_line = n
        log = _NCCL_LOG.match(stripped)
        if log:
            msg = log.group("msg")
            if log.group("level") == "WARN":
                run.nccl_warnings.append(f"line {n}: {log.group('host')}: {msg.strip()}")
            if (v := _VERSION.search(msg)) and run.nccl_version is None:
                run.nccl_version = v.group(1)
            if e := _ENV_SET.match(msg.strip()):
                run.env.setdefault(e.group(1), e.group(2).strip())
            continue
        if _FAILURE.search(stripped) and footer_line:
            # After the footer: the exit report of a validation failure (#wrong > 0), not a crash.
            run.warnings.append(f"line {n}: {stripped[:200]}")
            continue
        if _FAILURE.search(stripped):
            where = "failure in a result row" if stripped[:1].isdigit() else "the test failed"
            first_warn = f" (first NCCL WARN: {run.nccl_warnings[0]})" if run.nccl_warnings else ""
            raise NcclParseError(source, n, f"{where}: {stripped[:300]}{first_warn}")
        if stream == "stderr":
            continue  # another rank's stderr: noise for the table
        if stripped.startswith("NCCL version"):
            run.nccl_version = run.nccl_version or stripped.split()[2]
            continue
        if stripped.startswith("#"):
            if m := _TESTS_VERSION.match(stripped):
                run.tests_version = m.group(1)
                if m.group(3) and run.nccl_version is None:
                    run.nccl_version = _version_from_code(m.group(3))
            elif m := _STARTING.match(stripped):
                run.test = run.test or _test_from(m.group(2))
            elif "nThread" in stripped and "nGpus" in stripped:
                if run.header or run.rows:
                    raise NcclParseError(source, n, "a second run starts here; import one run per file")
                for key, rx in _HEADER_KEYS.items():
                    if hm := re.search(rx, stripped):
                        run.header[key] = hm.group(1)
            elif stripped.startswith("# Using devices"):
                in_devices = True
            elif m := _RANK.match(stripped):
                run.ranks.append(Rank(int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4),
                                      int(m.group(5)), m.group(6), m.group(7)))
            elif (c := _columns(stripped)) is not None:
                if cols is not None:
                    raise NcclParseError(source, n, "a second results table starts here; import one run per file")
                if "#wrong" not in c and "error" not in c:
                    raise NcclParseError(source, n, "unknown column layout: no '#wrong' or 'error' column")
                cols = c
                in_devices = False
            elif m := _OOB.match(stripped):
                run.out_of_bounds, run.oob_status = int(m.group(1)), m.group(2)
            elif m := _AVG.match(stripped):
                try:
                    run.avg_busbw = float(m.group(1))
                except ValueError:
                    raise NcclParseError(source, n, f"Avg bus bandwidth {m.group(1)!r} is not a number") from None
                footer_line = n
            elif stripped == "#" or "Reducing maxBytes" in stripped or "(elements)" in stripped \
                    or "out-of-place" in stripped:
                pass  # separators, the unit and placement lines of the column header, the memory-limit note
            elif cols is not None and not footer_line:
                run.warnings.append(f"line {n}: comment inside the table: {stripped[:120]}")
            else:
                run.warnings.append(f"line {n}: unrecognised comment: {stripped[:120]}")
            continue
        if stripped == "..." or stripped == "…":
            if in_devices or run.ranks and cols is None:
                raise NcclParseError(source, n, "the rank list is elided ('...'): ranks are missing, so the run's "
                                                "hosts and scope are unknown")
            raise NcclParseError(source, n, "output elided ('...'): rows are missing")
        if stripped[0].isdigit():
            if cols is None:
                raise NcclParseError(source, n, "result row before any column header: headerless output, the "
                                                "column layout cannot be checked")
            if footer_line:
                raise NcclParseError(source, n, "result row after the '# Avg bus bandwidth' footer")
            try:
                row = _row(stripped.split(), cols, n)
            except ValueError as exc:
                raise NcclParseError(source, n, f"malformed result row: {exc}") from None
            if row.size_bytes in seen_sizes:
                raise NcclParseError(source, n, f"size {row.size_bytes} repeats line {seen_sizes[row.size_bytes]}: "
                                                "rows of several runs are mixed")
            seen_sizes[row.size_bytes] = n
            run.rows.append(row)
            continue
        if run.command is None and _COMMAND.search(stripped) and ("mpirun" in stripped or "/" in stripped
                                                                    or stripped.startswith(("./", "srun"))):
            run.command = stripped
        elif run.command is not None and not run.ranks and run.command.endswith("\\"):
            run.command = run.command[:-1].rstrip() + " " + stripped
        elif stripped.startswith(("mpirun", "+ mpirun", "srun", "/")) and run.command is None:
            run.command = stripped
        else:
            run.warnings.append(f"line {n}: ignored: {stripped[:120]}")
    if cols is None:
        raise NcclParseError(source, last_line, "no results table (no '#  size  count  type ...' column header)")
    if not run.rows:
        raise NcclParseError(source, last_line, "the results table has no rows")
    if not footer_line:
        raise NcclParseError(source, last_line, f"truncated: no '# Avg bus bandwidth' footer after the last row "
                                                f"(line {run.rows[-1].line})")
    if run.command:
        for name, value in _ENV_ARG.findall(run.command):
            run.env.setdefault(name, value)
    run.test = test or run.test or _test_from(run.command or "") or _test_from(source)
    if not run.ranks:
        run.warnings.append("no '# Using devices' rank list: hosts and GPUs are unknown")
    elif [r.rank for r in run.ranks] != list(range(len(run.ranks))):
        raise NcclParseError(source, 0, "the rank list is not 0..N-1 in order: ranks are missing or repeated")
    mean = sum(r.oop_busbw + r.ip_busbw for r in run.rows) / (2 * len(run.rows))
    if run.avg_busbw is not None and abs(mean - run.avg_busbw) > max(0.01, 0.02 * run.avg_busbw):
        run.warnings.append(f"Avg bus bandwidth {run.avg_busbw} differs from the rows' mean {mean:.4g}: "
                            "rows may be missing")
    run.digest = digest(run)
    return run


def digest(run: NcclRun) -> str:
    """Identity of a run's measurements: re-importing the same output (any noise around it) finds the same run."""
    h = hashlib.sha256()
    h.update(f"{run.test}|{run.nccl_version}|{','.join(run.hosts)}|{sorted(run.header.items())}".encode())
    for r in run.rows:
        h.update(f"|{r.size_bytes}:{r.oop_time_us}:{r.oop_busbw}:{r.ip_time_us}:{r.ip_busbw}:{r.oop_wrong}"
                 f":{r.ip_wrong}".encode())
    h.update(f"|{[(r.rank, r.pid) for r in run.ranks]}".encode())
    return h.hexdigest()
