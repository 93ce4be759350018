"""Known-answer tests for every evaluation metric; each expected number is worked out by hand in the comment."""

from __future__ import annotations

import itertools
import random

import pytest

from service.evaluation import normalise
from service.evaluation.assignment import minimum_assignment
from service.evaluation.gold import Turn
from service.evaluation.metrics import (
    boundaries,
    coverage_over_time,
    cp_error_rate,
    diarization,
    drift_slope,
    edit_errors,
    error_rate,
    speaker_count_error,
    tail_coverage,
)


def test_normalisation_removes_moss_tags_punctuation_and_case() -> None:
    assert normalise.words("[0.50][S01]Good morning, everyone![1.68]") == ["good", "morning", "everyone"]
    assert normalise.words("Let's GO-now") == ["lets", "go", "now"]


def test_normalisation_scores_cjk_by_character() -> None:
    assert normalise.words("我们 今天开会。") == ["我", "们", "今", "天", "开", "会"]
    assert normalise.words("Mixed中文text") == ["mixed", "中", "文", "text"]
    assert normalise.characters("ab, c") == ["a", "b", "c"]


def test_edit_errors_counts_substitutions_deletions_insertions() -> None:
    # a b c -> a x c d: b->x (1 substitution), +d (1 insertion) = 2
    assert edit_errors(["a", "b", "c"], ["a", "x", "c", "d"]) == 2
    assert edit_errors([], ["a", "b"]) == 2
    assert edit_errors(["a"], []) == 1


def test_wer_and_cer_known_answers() -> None:
    gold = [Turn(0, 1, "A", "The cat"), Turn(1, 2, "B", "sat.")]
    # hypothesis in time order "the cat sat down": one insertion over 3 reference words
    hyp = [Turn(0, 2, "X", "the cat sat down")]
    assert error_rate(gold, hyp, "word").value == pytest.approx(1 / 3)
    # characters "abc" vs "abd": one substitution over 3
    assert error_rate([Turn(0, 1, "A", "a b c")], [Turn(0, 1, "X", "abd")], "char").value == pytest.approx(1 / 3)
    # CJK: 今天开会 vs 今天开了会: one insertion over 4 characters
    assert error_rate([Turn(0, 1, "A", "今天开会")], [Turn(0, 1, "X", "今天开了会")], "char").value == pytest.approx(0.25)


def test_error_rate_is_undefined_without_reference_words() -> None:
    ratio = error_rate([], [Turn(0, 1, "X", "a b")], "word")
    assert ratio.value is None and ratio.errors == 2


def test_cpwer_picks_the_best_speaker_permutation() -> None:
    gold = [Turn(0, 1, "A", "a b"), Turn(1, 2, "B", "c d")]
    hyp = [Turn(0, 1, "Y", "a b e"), Turn(1, 2, "X", "c d")]
    # A->Y: 1 insertion (e); B->X: 0. The other mapping costs 2 + 3 = 5. cpWER = 1/4.
    result = cp_error_rate(gold, hyp, "word")
    assert result.ratio.value == pytest.approx(0.25)
    assert result.mapping == {"A": "Y", "B": "X"}


def test_cpwer_counts_unmatched_speakers_and_attribution() -> None:
    # B has no hypothesis speaker left: its 1 word is a deletion. 1/3.
    assert cp_error_rate([Turn(0, 1, "A", "a b"), Turn(1, 2, "B", "c")], [Turn(0, 1, "X", "a b")], "word").ratio.value == pytest.approx(1 / 3)
    # an extra hypothesis speaker: its 2 words are insertions over 2 reference words = 1.0
    assert cp_error_rate([Turn(0, 1, "A", "a b")], [Turn(0, 1, "X", "a b"), Turn(2, 3, "Y", "z z")], "word").ratio.value == 1.0
    # all words right, all under one speaker: WER 0, but cpWER = (2 insertions for A->X + 2 deletions of B) / 4 = 1
    gold = [Turn(0, 1, "A", "a b"), Turn(1, 2, "B", "c d")]
    hyp = [Turn(0, 2, "X", "a b c d")]
    assert error_rate(gold, hyp, "word").value == 0
    assert cp_error_rate(gold, hyp, "word").ratio.value == 1.0


def test_cpcer_scores_characters_per_speaker() -> None:
    # A "ab" -> X "ab" (0), B "cd" -> Y "ce" (1 substitution): 1 / 4 characters
    gold = [Turn(0, 1, "A", "ab"), Turn(1, 2, "B", "cd")]
    hyp = [Turn(0, 1, "X", "ab"), Turn(1, 2, "Y", "ce")]
    assert cp_error_rate(gold, hyp, "char").ratio.value == pytest.approx(0.25)


def test_der_confusion_with_and_without_collar() -> None:
    gold = [Turn(0, 10, "A"), Turn(10, 20, "B")]
    hyp = [Turn(0, 12, "X"), Turn(12, 20, "Y")]
    # A->X, B->Y; 10-12 s is B's speech labelled X: 2 s confusion over 20 s = 0.1
    plain = diarization(gold, hyp, collar_s=0.0)
    assert plain.der.value == pytest.approx(0.1)
    assert (plain.miss_s, plain.false_alarm_s, plain.confusion_s) == pytest.approx((0, 0, 2.0))
    assert plain.mapping == {"A": "X", "B": "Y"}
    # collar 0.5 s removes [0,0.5), [9.5,10.5), [19.5,20): scored speech 9 + 9 = 18 s, confusion 10.5-12 = 1.5 s
    collared = diarization(gold, hyp, collar_s=0.5)
    assert collared.der.value == pytest.approx(1.5 / 18)
    # JER (no collar): A/X 1 - 10/12, B/Y 1 - 8/10; mean (1/6 + 1/5) / 2
    assert plain.jer.value == pytest.approx((1 / 6 + 1 / 5) / 2)


def test_der_miss_and_false_alarm() -> None:
    # hypothesis shifted 2 s late: miss [0,2), false alarm [10,12) -> 4/10; JER 1 - 8/12 = 1/3
    result = diarization([Turn(0, 10, "A")], [Turn(2, 12, "X")], collar_s=0.0)
    assert result.miss_s == pytest.approx(2.0) and result.false_alarm_s == pytest.approx(2.0)
    assert result.der.value == pytest.approx(0.4)
    assert result.jer.value == pytest.approx(1 / 3)


def test_der_scores_overlapped_speech() -> None:
    # B overlaps A for 5 s; one hypothesis speaker: speech 15 s, 5 s missed -> 1/3; JER (0 + 1) / 2
    result = diarization([Turn(0, 10, "A"), Turn(5, 10, "B")], [Turn(0, 10, "X")], collar_s=0.0)
    assert result.der.value == pytest.approx(1 / 3)
    assert result.jer.value == pytest.approx(0.5)
    assert result.mapping == {"A": "X", "B": None}


def test_perfect_diarization_is_zero() -> None:
    gold = [Turn(0.5, 1.68, "S01"), Turn(2.6, 3.71, "S02")]
    hyp = [Turn(0.5, 1.68, "spk_a"), Turn(2.6, 3.71, "spk_b")]
    result = diarization(gold, hyp, collar_s=0.25)
    assert result.der.value == 0 and result.jer.value == 0


def test_minimum_assignment_known_answer_and_brute_force() -> None:
    # rows->columns 1, 0, 2 cost 1 + 2 + 2 = 5; every other permutation costs 6 or more
    total, columns = minimum_assignment([[4, 1, 3], [2, 0, 5], [3, 2, 2]])
    assert (total, columns) == (5.0, [1, 0, 2])
    rng = random.Random(7)
    for size in range(1, 6):
        for _ in range(20):
            cost = [[rng.randint(0, 9) for _ in range(size)] for _ in range(size)]
            best = min(sum(cost[i][p[i]] for i in range(size)) for p in itertools.permutations(range(size)))
            assert minimum_assignment(cost)[0] == best


def test_boundaries_and_drift() -> None:
    gold = [Turn(1, 3, "A"), Turn(4, 6, "B")]
    hyp = [Turn(1.2, 3.1, "X"), Turn(3.9, 6.5, "Y")]
    # start errors 0.2, 0.1 -> mean 0.15; end errors 0.1, 0.5 -> mean 0.3
    result = boundaries(gold, hyp)
    assert result.start_abs.value == pytest.approx(0.15)
    assert result.end_abs.value == pytest.approx(0.3)
    assert result.drift == [(1, 0.2), (4, -0.1)]
    assert boundaries(gold, []).paired == 0
    assert result.consistency.value == 1.0


def test_speaker_consistency_counts_turns_off_their_dominant_label() -> None:
    # A's three turns paired with X, X, Y (dominant X: 2); B's two with Y, Y (2): 4 of 5 paired turns
    gold = [Turn(0, 1, "A"), Turn(2, 3, "B"), Turn(4, 5, "A"), Turn(6, 7, "B"), Turn(8, 9, "A")]
    hyp = [Turn(0, 1, "X"), Turn(2, 3, "Y"), Turn(4, 5, "X"), Turn(6, 7, "Y"), Turn(8, 9, "Y")]
    assert boundaries(gold, hyp).consistency.value == pytest.approx(0.8)
    # offsets 0 s at 0 and 2 s at 3600 s: 2 s per hour
    assert drift_slope([(0.0, 0.0), (3600.0, 2.0)]) == pytest.approx(2.0)


def test_speaker_count_and_tail_coverage() -> None:
    gold = [Turn(0, 4, "A"), Turn(5, 10, "B")]
    assert speaker_count_error(gold, [Turn(0, 1, "X"), Turn(1, 2, "Y"), Turn(2, 6, "Z")]) == 1
    # last hypothesis end 6 s against last gold end 10 s
    assert tail_coverage(gold, [Turn(0, 6, "X")]) == pytest.approx(0.6)
    assert tail_coverage(gold, []) == 0.0


def test_coverage_over_time() -> None:
    # gold speech 0-10 s, hypothesis covers 0-2.5 s; 5 s bins: 2.5/5, 0/5, then an empty bin at 10 s
    rows = coverage_over_time([Turn(0, 10, "A")], [Turn(0, 2.5, "X")], bin_s=5.0)
    assert [r["coverage"] for r in rows] == [pytest.approx(0.5), 0.0, None]
    assert [r["start_s"] for r in rows] == [0.0, 5.0, 10.0]
