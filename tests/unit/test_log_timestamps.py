"""Kubelet log timestamps are UTC: parsed the same in every local time zone, summer or winter."""

from __future__ import annotations

import calendar
import os
import time

import pytest

from kfp_trainer.timestamps import parse_timestamp, rfc3339


@pytest.fixture(params=["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe"])
def local_zone(request):
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    yield request.param
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-01-15T08:30:00Z",  # winter
        "2026-07-01T12:00:00.5Z",  # summer (DST in Berlin and New York)
        "2026-03-29T01:30:00.123456789Z",  # the hour Berlin skips
        "2026-11-01T05:30:00.000001Z",  # the hour New York repeats
        "2024-02-29T23:59:59Z",
    ],
)
def test_timestamps_mean_the_same_instant_in_any_local_zone(local_zone, stamp):
    whole = stamp[:19]
    expected = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    fraction = stamp[20:-1] if "." in stamp else ""
    assert parse_timestamp(stamp) == (expected, int(fraction.ljust(9, "0")) if fraction else 0)
    assert rfc3339(parse_timestamp(stamp)[0]) == whole + "Z"


@pytest.mark.parametrize(
    "text",
    ["hello", "2026-12-02 10:00:00", "2026-13-02T10:00:00Z", "2026-12-02T10:00:00", "2026-12-02T10:00:0xZ", "2026-12-02T10:00:00.1aZ", ""],
)
def test_what_is_not_a_timestamp_is_a_line_of_its_own(text):
    assert parse_timestamp(text) is None


def test_bytes_and_text_parse_alike():
    assert parse_timestamp(b"2026-12-02T10:00:00.25Z") == parse_timestamp("2026-12-02T10:00:00.25Z")
