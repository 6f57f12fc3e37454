"""Reading one data file into rows (dicts of column -> value).

Formats, chosen by the file's suffix:

* ``.jsonl`` / ``.ndjson``: one JSON object per non-empty line;
* ``.json``: a list of objects, an object ``{"data": [...]}``, or JSON Lines saved as ``.json``;
* ``.csv``: a header row, then one row per record; cells are text, except a cell holding a JSON
  list of objects (a chat written out as JSON), which is decoded;
* ``.parquet``: read with ``pyarrow``;
* ``.arrow``: an Arrow IPC stream (what ``datasets.Dataset.save_to_disk`` writes) or file,
  read with ``pyarrow`` (the ``datasets`` package is not needed).

Errors name the file, the line or row and what was expected; they never quote a cell's value.
Only the standard library is imported at module level; ``pyarrow`` when a parquet or arrow
file is read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ..errors import UserError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
DATA_SUFFIXES = (*JSONL_SUFFIXES, ".json", ".csv", ".parquet", ".arrow")
#: Files that describe a dataset rather than hold its records (``save_to_disk``, Hub metadata, builtin info).
METADATA_NAMES = frozenset({"dataset_info.json", "dataset_infos.json", "dataset_dict.json", "state.json"})


class DatasetError(UserError):
    """A dataset cannot be read: no split found, a file unreadable, or records of no accepted shape."""


def is_data_file(path: Path) -> bool:
    """Whether ``path`` has a data suffix and is not a metadata file.

    Example:
        >>> is_data_file(Path("data/train-00000-of-00001.parquet")), is_data_file(Path("state.json"))
        (True, False)
    """
    return path.suffix.lower() in DATA_SUFFIXES and path.name.lower() not in METADATA_NAMES


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Reads the records of one data file.

    Args:
        path: A file with one of the suffixes in :data:`DATA_SUFFIXES`.

    Returns:
        One dict per record, in file order.

    Raises:
        DatasetError: The suffix is unknown, the file is malformed, or ``pyarrow`` is missing.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return _read_json_lines(path, path.read_text(encoding="utf-8"))
    if suffix == ".json":
        return _read_json(path)
    if suffix == ".csv":
        with open(path, encoding="utf-8", newline="") as f:
            return [{k: _cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
    if suffix in (".parquet", ".arrow"):
        return _read_arrow_table(path)
    raise DatasetError(f"{path.name}: unknown data file suffix {suffix!r}; accepted: {', '.join(DATA_SUFFIXES)}")


def _cell(value: str | None) -> Any:
    if value and value.startswith("[{"):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, list) and all(isinstance(item, dict) for item in decoded):
            return decoded
    return value


def _read_json_lines(path: Path, text: str) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise DatasetError(f"{path.name}, line {number}: not valid JSON (expected one JSON object per line)") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path.name}, line {number}: a JSON {type(row).__name__}, expected a JSON object per line")
        rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # JSON Lines in a .json file, as many Hub datasets store them
            return _read_json_lines(path, text)
        raise DatasetError(f"{path.name}: not valid JSON (line {e.lineno}, column {e.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if isinstance(data, dict):  # one record on its own
        data = [data]
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise DatasetError(f'{path.name}: expected a list of JSON objects or {{"data": [...]}}')
    return data


def _read_arrow_table(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{path.name}: reading {path.suffix} files needs the 'pyarrow' package, which is not installed") from None
    try:
        if path.suffix.lower() == ".parquet":
            table = pq.read_table(path)
        else:
            try:
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                with pa.memory_map(str(path)) as source:
                    table = pa.ipc.open_file(source).read_all()
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path.name}: cannot be read as {path.suffix[1:]} ({type(e).__name__})") from None
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def columns_of(rows: list[dict[str, Any]]) -> list[str]:
    """Column names of ``rows`` in order of first appearance.

    Example:
        >>> columns_of([{"a": 1}, {"b": 2, "a": 3}])
        ['a', 'b']
    """
    seen: dict[str, None] = {}
    for row in rows:
        for key in row:
            seen.setdefault(str(key), None)
    return list(seen)
