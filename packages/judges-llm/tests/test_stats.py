"""The statistics, against values worked out by hand (ties included)."""

from __future__ import annotations

import math

import pytest

from reinforge_judges_llm import cohen_kappa, kendall_tau, pearson, rankdata, spearman

HUMAN = [1, 2, 2, 3, 4, 4, 5, 5]
JUDGE = [1, 3, 2, 3, 3, 5, 4, 5]


def test_average_ranks_for_ties() -> None:
    assert rankdata([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    assert rankdata(HUMAN) == [1, 2.5, 2.5, 4, 5.5, 5.5, 7.5, 7.5]
    assert rankdata(JUDGE) == [1, 4, 2, 4, 4, 7.5, 6, 7.5]


def test_spearman_with_ties_by_hand() -> None:
    # rank deviations from 4.5: human [-3.5,-2,-2,-.5,1,1,3,3], judge [-3.5,-.5,-2.5,-.5,-.5,3,1.5,3]
    # sum of products 34.5; sums of squares 40.5 and 39.5
    assert spearman(HUMAN, JUDGE) == pytest.approx(34.5 / math.sqrt(40.5 * 39.5))
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [5, 5, 5]) is None
    assert spearman([1], [2]) is None


def test_kendall_tau_b_with_ties_by_hand() -> None:
    # 28 pairs; 3 tied in human, 4 tied in judge; 20 concordant, 1 discordant (items 6 and 7)
    assert kendall_tau(HUMAN, JUDGE) == pytest.approx(19 / math.sqrt(25 * 24))
    assert kendall_tau([1, 2, 3, 4], [1, 2, 3, 4]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert kendall_tau([1, 1, 1], [1, 2, 3]) is None


def test_cohen_kappa_by_hand() -> None:
    # observed agreement 4/8; chance (1*1 + 2*1 + 1*3 + 2*1 + 2*2) / 64 = 12/64; kappa = (1/2 - 3/16) / (13/16)
    assert cohen_kappa(HUMAN, JUDGE) == pytest.approx(5 / 13)
    a, b = [1, 2, 3], [1, 3, 3]
    assert cohen_kappa(a, b) == pytest.approx(1 / 2)
    assert cohen_kappa(a, b, weights="linear") == pytest.approx(2 / 3)
    assert cohen_kappa(a, b, weights="quadratic") == pytest.approx(0.8)
    assert cohen_kappa(["x", "y"], ["x", "y"]) == pytest.approx(1.0)
    assert cohen_kappa([3, 3], [3, 3]) is None  # chance agreement is total
    # a category neither rater used still counts for the weights' distances
    assert cohen_kappa([1, 3], [3, 1], categories=[1, 2, 3], weights="linear") == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="not among the categories"):
        cohen_kappa([1, 7], [1, 2], categories=[1, 2, 3])
    with pytest.raises(ValueError, match="weights"):
        cohen_kappa([1], [1], weights="cubic")


def test_pearson_and_length_mismatch() -> None:
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ in length"):
        spearman([1, 2], [1])
