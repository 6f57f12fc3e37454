r"""Datasets as users bring them, read as prompt/completion examples.

What the SFT trainer (:mod:`kfp_trainer.trainers.sft`) and ``evaluate_model``
(:mod:`kfp_trainer.trainers.evaluate`) read with :func:`load_split`:

* a dataset **folder** as ``dataset_initializer`` fetches it: ``<split>.<ext>`` files
  (``train.jsonl``, ``test.parquet``), a Hugging Face Hub snapshot
  (``data/train-00000-of-00001-*.parquet``), ``<split>/`` subfolders, a
  ``datasets`` ``save_to_disk`` folder (``Dataset`` or ``DatasetDict`` with ``dataset_dict.json``),
  or a single data file of any name (read as the train split) -- see :mod:`kfp_trainer.data.splits`;
  or one data **file** (read whole for any split);
* **formats** ``.jsonl``, ``.json`` (a list of records or ``{"data": [...]}``), ``.csv``,
  ``.parquet`` and ``.arrow`` (these two need ``pyarrow``) -- see :mod:`kfp_trainer.data.files`;
* **record shapes** prompt/completion, chat ``messages`` (or ShareGPT ``conversations``),
  Alpaca/Dolly instruction/input/output, question/answer, input/output -- see
  :mod:`kfp_trainer.data.shapes` for the templates;
* **preference pairs** (``prompt``, ``chosen``, ``rejected``: what DPO trains on) with
  :func:`load_preference_split`, in the same layouts and formats; :func:`load_split` reads
  them as the prompt with the chosen answer as its completion;
* a missing **test split**: the validation split, else a deterministic 5% slice of train
  (at most 1000 records) that training then leaves out, with a log line saying so.

Only the standard library is imported (``pyarrow`` when a parquet or arrow file is read).

Example:
    >>> import json, pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "train.jsonl").write_text(json.dumps({"instruction": "Add", "input": "", "output": "2"}) + "\n")
    >>> load_split(folder, "train", log=lambda _: None)[0]["completion"]
    '2'
"""

from .files import DatasetError
from .load import load_preference_split, load_prompt_split, load_split
from .shapes import chat_renderer
from .splits import discover

__all__ = ["DatasetError", "chat_renderer", "discover", "load_preference_split", "load_prompt_split", "load_split"]
