"""McNemar exact test at large discordant counts (issue 25)."""

from __future__ import annotations

from kitune.optimizers.acceptance import mcnemar_exact_p


def test_520_520_discordant_pairs_give_p_one_without_overflow() -> None:
    assert mcnemar_exact_p(520, 520) == 1.0


def test_known_small_case_is_exact() -> None:
    # b=1, c=9: 2 * (C(10,0) + C(10,1)) / 2**10 = 22 / 1024
    assert mcnemar_exact_p(1, 9) == 22 / 1024


def test_large_lopsided_case_is_tiny_but_not_zero() -> None:
    # float(2**1030) overflowed before; the exact value is 2 / 2**1030 = 2**-1029 (a subnormal float).
    assert mcnemar_exact_p(0, 1030) == 2.0**-1029
