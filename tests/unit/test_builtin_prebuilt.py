"""Builtins prebuilt into an image that cannot write them (kfp_trainer.trainers.prebuilt): materialize
copies them from $KFP_TRAINER_BUILTINS_DIR, and a builtin neither prebuilt nor writable here fails
with a message that names the image to use. (The component image built by buildah serves them for
real: tests/integration/test_images.py, test_realpods_images.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from kfp_trainer.errors import UserError
from kfp_trainer.trainers import builtin, prebuilt


def test_materialize_copies_the_prebuilt_files_instead_of_writing_them(tmp_path, monkeypatch):
    source = tmp_path / "builtins" / "models" / "tiny-char-lm"
    source.mkdir(parents=True)
    (source / "config.json").write_text('{"prebuilt": true}')
    monkeypatch.setenv(prebuilt.ENV, str(tmp_path / "builtins"))
    monkeypatch.setitem(sys.modules, "torch", None)  # writing it would fail: only the copy can succeed
    out = builtin.materialize("builtin://models/tiny-char-lm", tmp_path / "out")
    assert [p.name for p in out.iterdir()] == ["config.json"] and json.loads((out / "config.json").read_text()) == {"prebuilt": True}


def test_a_builtin_neither_prebuilt_nor_writable_names_the_trainer_image_and_what_is_prebuilt(tmp_path, monkeypatch):
    (tmp_path / "builtins" / "datasets" / "addition").mkdir(parents=True)
    monkeypatch.setenv(prebuilt.ENV, str(tmp_path / "builtins"))
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(prebuilt.BuiltinUnavailableError) as caught:
        builtin.materialize("builtin://models/tiny-char-lm", tmp_path / "out")
    message = str(caught.value)
    assert message.startswith("builtin://models/tiny-char-lm: writing it needs the package torch, which is missing here")
    assert "this image has builtin://datasets/addition prebuilt" in message and "kfp-trainer-trainer" in message
    assert isinstance(caught.value, UserError)  # a step exits with the user-error code, no traceback


def test_prebuild_lays_out_readable_files_and_says_what_wrote_them(tmp_path):
    info = builtin.prebuild(tmp_path, ["builtin://datasets/addition", "builtin://datasets/addition-preference"])
    assert info["uris"] == ["builtin://datasets/addition", "builtin://datasets/addition-preference"]
    assert json.loads((tmp_path / prebuilt.INFO).read_text()) == info
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(p.stat().st_mode & 0o444 == 0o444 for p in files)  # any USER of the image reads them
    assert (tmp_path / "datasets" / "addition" / "train.jsonl").read_text() == (
        builtin.materialize("builtin://datasets/addition", tmp_path / "fresh") / "train.jsonl").read_text()
