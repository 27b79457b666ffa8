from __future__ import annotations

import pytest

from autotune.core.budget import format_bytes, parse_budget
from autotune.core.errors import InputError

GiB = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("40GB", 40 * 10**9),
        ("40 GB", 40 * 10**9),
        ("40GiB", 40 * GiB),
        ("40gib", 40 * GiB),
        ("40000MiB", 40000 * 2**20),
        ("0.5TiB", 2**39),
        ("1.5GB", 1_500_000_000),
        ("512KiB", 512 * 1024),
        ("100B", 100),
        ("2TB", 2 * 10**12),
    ],
)
def test_accepted_budgets(text: str, expected: int) -> None:
    assert parse_budget(text).resolve(None) == expected


def test_percentage_is_of_the_device_total() -> None:
    budget = parse_budget("90%")
    assert budget.fraction == pytest.approx(0.9)
    assert budget.resolve(80 * GiB) == int(80 * GiB * 0.9)


@pytest.mark.parametrize(
    "text",
    [
        "40 GB/s",
        "-1GB",
        "0GB",
        "1e999GB",
        "nanGB",
        "infGB",
        "40",
        "GB",
        "",
        "40GB40GB",
        "1_000MB",
        "４０GB",
        "٤٠GB",
        "40  GB",
        "40XB",
        "0%",
        "101%",
        "0.0000000001B",
        ".5GB",
        "40 %",
    ],
)
def test_rejected_budgets_name_the_value_and_the_grammar(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_budget(text)
    message = str(info.value)
    assert repr(text) in message
    assert "\n" not in message


def test_budget_above_the_device_total_is_rejected() -> None:
    with pytest.raises(InputError, match=r"more than the device has"):
        parse_budget("100GiB").resolve(80 * GiB)
    assert parse_budget("80GiB").resolve(80 * GiB) == 80 * GiB


def test_percentage_without_a_known_total_is_rejected() -> None:
    with pytest.raises(InputError, match="percentage"):
        parse_budget("50%").resolve(None)


@pytest.mark.parametrize(
    ("size", "text"), [(0, "0 B"), (1023, "1023 B"), (1536 * 2**20, "1.50 GiB"), (2**40, "1.00 TiB")]
)
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text
