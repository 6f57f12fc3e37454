"""Numbers read from text -- flags, env values, quantities, durations -- take ASCII digits only.

Python's ``int()``, ``float()``, ``Decimal()`` and regular expressions' ``\\d`` also read the
digits of other scripts (``'١٢'`` is 12 to them); the API server and most programs do not.
"""

from __future__ import annotations

import pytest

from kfp_trainer import cli_run, gc, numbers
from kfp_trainer.errors import UserError, ValidationError
from kfp_trainer.quantity import is_quantity
from kfp_trainer.trainers import _common

# Arabic-Indic, fullwidth, Devanagari, ASCII and Arabic-Indic mixed, mathematical bold: 12 each
OTHER_DIGITS = ["\u0661\u0662", "\uff11\uff12", "\u0967\u0968", "1\u0662", "\U0001d7cf\U0001d7d0"]


@pytest.mark.parametrize("text", OTHER_DIGITS)
def test_numbers_in_other_scripts_are_refused_naming_where_they_came_from(text):
    assert int(text) == 12  # what Python alone would make of it
    with pytest.raises(ValidationError, match=r"--num-nodes: got .*; expected a whole number written with ASCII digits 0-9"):
        numbers.parse_int(text, "--num-nodes")
    with pytest.raises(ValidationError, match="--start-timeout: got"):
        numbers.parse_float(text, "--start-timeout")


@pytest.mark.parametrize("text", ["1_000", " 12", "12\n", "+", "", "0x10", "1e3"])
def test_whole_numbers_are_digits_alone(text):
    with pytest.raises(ValidationError):
        numbers.parse_int(text, "n")


def test_ascii_numbers_parse():
    assert [numbers.parse_int(t, "n") for t in ("0", "12", "-3", "+4")] == [0, 12, -3, 4]
    assert [numbers.parse_float(t, "s") for t in ("600", "1.5", ".5", "1e3", "-2")] == [600.0, 1.5, 0.5, 1000.0, -2.0]
    assert str(numbers.parse_float("nan", "s")) == "nan"  # a number; the range check names it


@pytest.mark.parametrize("text", [*OTHER_DIGITS, "\uff11\uff12Gi", "\u0661\u0662m", "1e\u0663"])
def test_quantities_in_other_scripts_are_not_quantities(text):
    assert not is_quantity(text)


@pytest.mark.parametrize("text", ["\u0661\u0662h", "\uff11d", "1h\u0663\u0660m"])
def test_gc_ages_in_other_scripts_are_refused(text):
    with pytest.raises(ValidationError, match="--older-than"):
        gc.parse_age(text)


def test_the_torchrun_environment_is_read_from_ascii_digits_only(monkeypatch):
    monkeypatch.setenv("RANK", "\u0661")
    with pytest.raises(ValidationError, match="environment variable RANK: got"):
        _common.dist_env()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert (_common.dist_env().rank, _common.dist_env().world_size) == (1, 2)


@pytest.mark.parametrize("kind", ["Integer", "Float"])
def test_pipeline_parameters_in_other_scripts_are_refused(kind):
    with pytest.raises(UserError, match=f"--param epochs=.*: expected a {kind.lower()}"):
        cli_run._typed("\uff11\uff12", kind, "epochs")
    assert cli_run._typed("12", kind, "epochs") == 12
