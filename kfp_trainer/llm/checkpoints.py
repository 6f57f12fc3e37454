"""Find the latest complete torchtune checkpoint in an output dir and the overrides that resume from it.

torchtune's HF checkpointer writes, at the end of every epoch ``e``, into ``<output_dir>/epoch_e/``:
the model shards ``model-0000i-of-0000N.safetensors`` then ``model.safetensors.index.json``; for
LoRA, ``adapter_model.pt``, ``adapter_model.safetensors`` then ``adapter_config.json``; then copies
the base model's other files (``config.json``, tokenizer). At every epoch but the last it then
writes ``recipe_state/recipe_state.pt`` (optimizer, seed, epochs run). A run killed part-way
leaves some of these behind, so "latest" means the newest epoch whose files are all there and
whose recipe state was written after them.

:func:`scan` reads a directory into a :class:`Listing` (names, sizes, mtimes; whether each
``.pt`` file is a whole zip archive); everything else here is pure.

Example:
    >>> listing = Listing.of({"epoch_0/model-00001-of-00001.safetensors": 10, "epoch_0/model.safetensors.index.json": 11,
    ...                       "epoch_0/config.json": 12, "recipe_state/recipe_state.pt": 13,
    ...                       "epoch_1/model-00001-of-00001.safetensors": 14})
    >>> plan = resume_plan(listing)
    >>> plan.epochs_done, plan.overrides
    (1, ['resume_from_checkpoint=True', 'checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]', \
'checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt'])
"""

from __future__ import annotations

import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

RECIPE_STATE = "recipe_state/recipe_state.pt"
_EPOCH = re.compile(r"^epoch_(\d+)$")
_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
_INDEX = "model.safetensors.index.json"
_ADAPTER = "adapter_model.pt"
_ADAPTER_DONE = "adapter_config.json"


@dataclass(frozen=True)
class Entry:
    """One file: modification time (ns) and, for ``.pt`` files, whether the zip archive is whole."""

    mtime_ns: int
    intact: bool = True


@dataclass(frozen=True)
class Listing:
    """The files under an output dir, by path relative to it (``/``-separated)."""

    files: dict[str, Entry] = field(default_factory=dict)

    @classmethod
    def of(cls, mtimes: dict[str, int], *, broken: tuple[str, ...] = ()) -> Listing:
        """A listing from ``{path: mtime}``; ``broken`` names ``.pt`` files cut off mid-write."""
        return cls({p: Entry(t, p not in broken) for p, t in mtimes.items()})


@dataclass(frozen=True)
class EpochCheckpoint:
    """A complete ``epoch_<n>`` folder."""

    epoch: int
    adapter: bool
    model_files: tuple[str, ...]
    newest_ns: int

    @property
    def folder(self) -> str:
        """``epoch_<n>``, relative to the output dir."""
        return f"epoch_{self.epoch}"


@dataclass(frozen=True)
class ResumePlan:
    """What a rerun should do: resume after ``epochs_done`` epochs with ``overrides``, or nothing.

    ``finished`` means the last epoch's checkpoint is complete: the final model is in ``final``.
    """

    epochs_done: int
    overrides: list[str]
    checkpoint: EpochCheckpoint | None
    finished: bool = False
    final: EpochCheckpoint | None = None


def scan(output_dir: str | Path) -> Listing:
    """Read ``output_dir`` into a :class:`Listing` (stat only; ``.pt`` files get a zip-integrity check)."""
    root = Path(output_dir)
    files: dict[str, Entry] = {}
    if not root.is_dir():
        return Listing(files)
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            try:
                st = path.stat()
            except OSError:
                continue
            files[rel] = Entry(st.st_mtime_ns, zipfile.is_zipfile(path) if name.endswith(".pt") else True)
    return Listing(files)


def _epoch_checkpoint(epoch: int, names: dict[str, Entry], adapter: bool | None) -> EpochCheckpoint | None:
    folder = f"epoch_{epoch}"
    shards = {}
    for name in names:
        m = _SHARD.match(name)
        if m:
            shards[int(m.group(1))] = (name, int(m.group(2)))
    totals = {total for _, total in shards.values()}
    model_whole = _INDEX in names and len(totals) == 1 and set(shards) == set(range(1, totals.pop() + 1))
    has_adapter = _ADAPTER_DONE in names and names.get(_ADAPTER, Entry(0, False)).intact
    is_adapter = has_adapter if adapter is None else adapter
    if is_adapter and not has_adapter:
        return None
    if not is_adapter and not model_whole:
        return None
    if "config.json" not in names:
        return None
    files = (f"{folder}/{_ADAPTER}",) if is_adapter else tuple(f"{folder}/{shards[i][0]}" for i in sorted(shards))
    return EpochCheckpoint(epoch=epoch, adapter=is_adapter, model_files=files, newest_ns=max(e.mtime_ns for e in names.values()))


def complete_epochs(listing: Listing, *, adapter: bool | None = None) -> list[EpochCheckpoint]:
    """Every complete ``epoch_<n>`` folder, oldest first.

    ``adapter``: ``True`` for LoRA runs (needs the adapter), ``False`` for full fine-tunes
    (needs every model shard), ``None`` to tell from the files.
    """
    by_epoch: dict[int, dict[str, Entry]] = {}
    for path, entry in listing.files.items():
        head, _, name = path.partition("/")
        m = _EPOCH.match(head)
        if m and name and "/" not in name:
            by_epoch.setdefault(int(m.group(1)), {})[name] = entry
    found = (_epoch_checkpoint(e, names, adapter) for e, names in sorted(by_epoch.items()))
    return [c for c in found if c is not None]


def resume_overrides(checkpoint: EpochCheckpoint) -> list[str]:
    """``tune run`` overrides that continue training after ``checkpoint`` (paths relative to ``output_dir``).

    Full fine-tunes name the epoch's model files (torchtune reads them from ``output_dir`` when
    resuming); LoRA runs name the adapter (the base weights come from ``checkpoint_dir`` as usual).
    """
    out = ["resume_from_checkpoint=True"]
    if checkpoint.adapter:
        out.append(f"checkpointer.adapter_checkpoint={checkpoint.model_files[0]}")
    else:
        out.append(f"checkpointer.checkpoint_files=[{','.join(checkpoint.model_files)}]")
    return out + [f"checkpointer.recipe_checkpoint={RECIPE_STATE}"]


def resume_plan(listing: Listing, *, total_epochs: int | None = None, adapter: bool | None = None) -> ResumePlan:
    """Where a rerun of the same fine-tune should start.

    Args:
        listing: the output dir's files (:func:`scan`).
        total_epochs: the run's ``epochs``; lets a complete last epoch count as finished.
        adapter: ``True`` for LoRA, ``False`` for full fine-tunes, ``None`` to infer.

    Returns:
        ``epochs_done == 0`` and no overrides when nothing usable is there (start over);
        otherwise the overrides that resume after the newest complete epoch whose recipe
        state was saved after it; ``finished`` when epoch ``total_epochs - 1`` is complete.
    """
    epochs = complete_epochs(listing, adapter=adapter)
    if total_epochs is not None:
        last = [c for c in epochs if c.epoch == total_epochs - 1]
        if last:
            return ResumePlan(epochs_done=total_epochs, overrides=[], checkpoint=None, finished=True, final=last[0])
    state = listing.files.get(RECIPE_STATE)
    if state is not None and state.intact:
        for ckpt in reversed(epochs):
            if state.mtime_ns >= ckpt.newest_ns:
                return ResumePlan(epochs_done=ckpt.epoch + 1, overrides=resume_overrides(ckpt), checkpoint=ckpt)
    return ResumePlan(epochs_done=0, overrides=[], checkpoint=None)
