"""Finding a dataset's splits in a folder, and the held-out test slice of a train-only dataset.

A file's split is the first of:

1. in a ``save_to_disk`` folder (one with ``state.json``) below the root: the folder's name
   (a ``DatasetDict``'s ``train/``, ``test/``, ...); at the root: no name (a lone ``Dataset``);
2. a Hub shard name ``<split>-00000-of-00001[-...]`` (``data/train-00000-of-00001-*.parquet``):
   ``<split>``, whatever it is (``train_sft`` too);
3. the file's stem, when it is a split name (``train.jsonl``, ``test.parquet``);
4. a standard split name inside the stem between ``-``, ``_``, ``.`` or spaces (``alpaca_train.json``);
5. the nearest folder named after a split (``train/part-0.parquet``, ``default/test/0000.parquet``).

Split names are the one asked for, those listed in ``dataset_dict.json``, and the standard
ones with their aliases: ``train`` (``training``), ``validation`` (``valid``, ``val``, ``dev``),
``test`` (``testing``, ``eval``, ``evaluation``). Files of no split belong to ``train`` when no
file is named train (``alpaca_data.json``, a lone ``save_to_disk`` dataset).

A missing ``test`` split falls back to the validation split; a dataset with neither holds out a
deterministic slice of train (:func:`holdout`) as its test split, and train is then read without it,
so a model is never evaluated on records it was trained on. Hidden files and folders (``.cache``)
are skipped.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .files import is_data_file

GROUPS = {
    "train": ("train", "training"),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "testing", "eval", "evaluation"),
}
STANDARD = frozenset(name for names in GROUPS.values() for name in names)
#: Fraction of train held out as the test split of a dataset without test or validation split.
HOLDOUT_FRACTION = 0.05
#: At most this many held-out records.
HOLDOUT_MAX = 1000
_SHARD = re.compile(r"(?P<split>[A-Za-z0-9_.]+?)-\d{5}-of-\d{5}(?:-.*)?")


def aliases(split: str) -> tuple[str, ...]:
    """The names a split may have on disk.

    Example:
        >>> aliases("validation"), aliases("train_sft")
        (('validation', 'valid', 'val', 'dev'), ('train_sft',))
    """
    for names in GROUPS.values():
        if split.lower() in names:
            return names
    return (split,)


@dataclass
class Layout:
    """The data files of a dataset folder, by split.

    Attributes:
        root: The dataset folder.
        splits: Split name as found on disk -> its files, sorted.
        unnamed: Data files of no split.
    """

    root: Path
    splits: dict[str, list[Path]] = field(default_factory=dict)
    unnamed: list[Path] = field(default_factory=list)

    @property
    def files(self) -> list[Path]:
        """Every data file, sorted."""
        return sorted([f for files in self.splits.values() for f in files] + self.unnamed)

    def find(self, split: str) -> list[Path]:
        """The files of ``split`` under any of its :func:`aliases`; for train, else the unnamed files."""
        files = sorted(f for name in aliases(split) for f in self.splits.get(name, []))
        if not files and split in GROUPS["train"] and not any(n in self.splits for n in GROUPS["train"]):
            files = list(self.unnamed)
        return files


def _dict_splits(root: Path) -> set[str]:
    try:
        data = json.loads((root / "dataset_dict.json").read_text())
    except (OSError, ValueError):
        return set()
    names = data.get("splits") if isinstance(data, dict) else None
    return {str(n) for n in names} if isinstance(names, list) else set()


def split_of(relative: Path, names: set[str], save_to_disk_dir: bool) -> str | None:
    """The split of a data file, by the rules in this module's docstring.

    Args:
        relative: The file's path below the dataset folder.
        names: Split names to recognise in stems and folders (besides the standard ones).
        save_to_disk_dir: Whether the file's folder holds a ``state.json``.

    Example:
        >>> split_of(Path("data/train-00000-of-00001-a1b2.parquet"), set(), False)
        'train'
        >>> split_of(Path("alpaca_data.json"), set(), False) is None
        True
    """
    folders = [p.lower() for p in relative.parts[:-1]]
    if save_to_disk_dir:
        return relative.parts[-2] if folders else None
    stem = relative.name.split(".")[0] if relative.suffix else relative.name
    shard = _SHARD.fullmatch(stem)
    if shard:
        return shard.group("split")
    known = names | STANDARD
    if stem.lower() in known:
        return stem.lower() if stem.lower() in STANDARD else stem
    for token in re.split(r"[-_. ]+", stem.lower()):
        if token in STANDARD:
            return token
    for folder, original in zip(reversed(folders), reversed(relative.parts[:-1]), strict=True):
        if folder in known:
            return folder if folder in STANDARD else original
    return None


def discover(root: str | Path, split: str = "train") -> Layout:
    """The data files under ``root`` grouped by split.

    Args:
        root: A dataset folder.
        split: The split about to be read (a name to recognise even if not standard).
    """
    root = Path(root)
    names = {split} | _dict_splits(root)
    layout = Layout(root)
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file() or not is_data_file(path):
            continue
        name = split_of(relative, names, (path.parent / "state.json").is_file())
        if name is None:
            layout.unnamed.append(path)
        else:
            layout.splits.setdefault(name, []).append(path)
    return layout


def _digest(row: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()


def holdout(rows: list[dict[str, Any]]) -> set[int]:
    """Indices of the records held out of a train split as its test split.

    :data:`HOLDOUT_FRACTION` of the records (at least 1 when there are 2 or more, at most
    :data:`HOLDOUT_MAX`): those whose content hashes (SHA-256 of the record as sorted JSON)
    are smallest. The choice depends on the records only, not on their order, and identical
    records land on the same side.

    Example:
        >>> rows = [{"prompt": str(i), "completion": str(i)} for i in range(100)]
        >>> held = holdout(rows)
        >>> len(held), {rows[i]["prompt"] for i in held} == {rows[::-1][i]["prompt"] for i in holdout(rows[::-1])}
        (5, True)
    """
    if len(rows) < 2:
        return set()
    count = min(HOLDOUT_MAX, max(1, round(len(rows) * HOLDOUT_FRACTION)))
    digests = [_digest(row) for row in rows]
    cutoff = sorted(digests)[count - 1]
    return {i for i, d in enumerate(digests) if d <= cutoff}
