"""The bounds on inputs (sidecar/limits.py): the number checks, and the rows docs/limits.md is made of."""

from __future__ import annotations

import math

import pytest

from sidecar.limits import LIMITS, OutOfRange, finite_number, whole_number
from sidecar.settings import ALERT_SETTINGS, SETTINGS, TARGET_SETTINGS

SURFACES = ("page", "config", "model", "http", "history")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(6144, 6144), ("6144", 6144), (6144.0, 6144), ("6.144e3", 6144), (0, 0), ("1000000", 1_000_000)],
)
def test_whole_number_takes_integral_values(value, expected):
    got = whole_number(value, "num_gpu_blocks", low=0, high=10**6)
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    "value",
    [
        "1e999",  # overflows to inf
        "inf",
        "-inf",
        "nan",
        float("nan"),
        math.inf,
        "-6144",  # below the range
        "1.28e32",  # above it
        10**400,  # an int too big for a float
        "9" * 100,  # text too long to be any count
        16.5,  # not whole
        "16.5",
        True,  # YAML's yes is not a count
        None,
        "",
        "sixteen",
        [16],
        {"n": 16},
    ],
)
def test_whole_number_refuses_what_cannot_be_a_count(value):
    with pytest.raises(OutOfRange) as e:
        whole_number(value, "num_gpu_blocks", low=0, high=10**6)
    message = str(e.value)
    assert message.startswith("num_gpu_blocks: ") and "a whole number from 0 to 1000000" in message
    assert len(message) < 120  # a 100-digit value is shortened, never quoted whole


@pytest.mark.parametrize("value", ["nan", "inf", "1e999", -0.5, 1.5, False, "0.5x", object()])
def test_finite_number_refuses_what_is_not_a_fraction(value):
    with pytest.raises(OutOfRange, match=r"^usage: .* is not a finite number from 0 to 1$"):
        finite_number(value, "usage", low=0.0, high=1.0)


def test_finite_number_keeps_the_value():
    assert finite_number("0.936", "usage", low=0.0, high=1.0) == 0.936
    assert finite_number(1, "usage", low=0.0, high=1.0) == 1.0


def test_every_limit_row_is_well_formed():
    keys = [limit.key for limit in LIMITS]
    assert len(keys) == len(set(keys)), "two limits share a key"
    for limit in LIMITS:
        surface, _, name = limit.key.partition(".")
        assert surface in SURFACES and name, limit.key
        assert isinstance(limit.default, int | float) and not isinstance(limit.default, bool), limit.key
        assert limit.default > 0, limit.key
        for text in (limit.unit, limit.bounds, limit.exceeded, limit.change):
            assert text.strip(), limit.key


def _setting(path: str):
    section, _, key = path.replace("[]", "").partition(".")
    for row in (*SETTINGS, *TARGET_SETTINGS, *ALERT_SETTINGS):
        if row.section == section and row.key == key:
            return row
    raise AssertionError(f"no setting {path}")


def test_a_configurable_limit_shows_its_settings_default():
    for limit in LIMITS:
        if limit.setting is not None:
            assert _setting(limit.setting).default == limit.default, limit.key
            assert limit.setting in limit.change, limit.key
