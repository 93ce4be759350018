"""Stop classification from the engine's own outputs, coverage and truncation."""

from __future__ import annotations

import pytest

from service.evidence import classify_stop, measure_coverage, truncation_reasons
from service.transcript import parse_transcript

EOS = (7, 8)


def classify(finish, stop_reason, ids, max_tokens=100, prompt=50, max_len=1000):
    return classify_stop(
        finish_reason=finish, stop_reason=stop_reason, token_ids=ids, eos_token_ids=EOS,
        max_tokens=max_tokens, prompt_tokens=prompt, max_model_len=max_len, token_text=lambda t: f"<t{t}>",
    )


def test_tokenizer_eos_is_eos_with_its_token() -> None:
    record = classify("stop", None, [1, 2, 7])
    assert (record.stop, record.end_token_id, record.end_token, record.budget_left) == ("eos", 7, "<t7>", 97)


def test_generation_config_end_token_is_eos() -> None:
    record = classify("stop", 8, [1, 2, 8])
    assert (record.stop, record.end_token_id) == ("eos", 8)


def test_other_stop_token_and_stop_string() -> None:
    assert classify("stop", 42, [1, 42]).stop == "stop_token"
    assert classify("stop", "</s>", [1, 2]).stop == "stop_token"


def test_length_is_max_tokens_or_context() -> None:
    assert classify("length", None, [1] * 100).stop == "max_tokens"
    record = classify("length", None, [1] * 30, max_tokens=100, prompt=970, max_len=1000)
    assert record.stop == "context_length"


@pytest.mark.parametrize(("finish", "expected"), [("abort", "aborted"), ("error", "error"), (None, "unknown")])
def test_other_finishes(finish, expected) -> None:
    assert classify(finish, None, [1]).stop == expected


def test_stop_without_end_token_is_unknown_not_guessed() -> None:
    assert classify("stop", None, [1, 2, 3]).stop == "unknown"


def test_coverage_and_truncation() -> None:
    transcript = parse_transcript("[0.00][S01]hello[4.00][4.50][S02]wor")
    coverage = measure_coverage(transcript, 10.0)
    assert coverage.last_segment_end_s == 4.0
    assert coverage.coverage == 0.4
    assert coverage.uncovered_tail_s == 6.0
    reasons = truncation_reasons(classify("length", None, [1] * 100), coverage, margin_s=2.0)
    assert len(reasons) == 2
    clean = measure_coverage(parse_transcript("[0.00][S01]hello[9.50]"), 10.0)
    assert truncation_reasons(classify("stop", None, [1, 7]), clean, margin_s=2.0) == []
    inside = measure_coverage(parse_transcript("[0.00][S01]hello[9.50][9.6"), 10.0)
    assert inside.ends_inside_tag
    assert truncation_reasons(classify("stop", None, [1, 7]), inside, margin_s=2.0) == ["text ends inside an unfinished tag"]
