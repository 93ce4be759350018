"""The chunking policy and OpenAI's `chunking_strategy` field: mapping and refusals."""

from __future__ import annotations

from typing import Any

import pytest

from service.longform.cuts import ChunkingPolicy, from_request

DEFAULTS = ChunkingPolicy()


def test_absent_strategy_means_the_native_track() -> None:
    assert from_request(None, defaults=DEFAULTS) is None


def test_auto_uses_the_server_defaults() -> None:
    custom = ChunkingPolicy(target_s=300.0, max_chunk_s=400.0)
    assert from_request("auto", defaults=custom) is custom


def test_server_vad_maps_every_field() -> None:
    strategy = {"type": "server_vad", "silence_duration_ms": 800, "prefix_padding_ms": 200, "threshold": 0.7}
    policy = from_request(strategy, defaults=ChunkingPolicy(threshold_db=-45.0))
    assert policy is not None
    assert (policy.min_silence_s, policy.prefix_padding_s, policy.activation) == (0.8, 0.2, 0.7)
    assert policy.threshold_db is None  # the request's relative threshold replaces the operator's absolute one
    assert (policy.target_s, policy.overlap_s, policy.max_chunk_s) == (600.0, 10.0, 900.0)


def test_server_vad_without_options_keeps_the_defaults() -> None:
    assert from_request({"type": "server_vad"}, defaults=DEFAULTS) == DEFAULTS


def test_server_vad_as_a_json_string_from_a_form() -> None:
    policy = from_request('{"type": "server_vad", "silence_duration_ms": 500}', defaults=DEFAULTS)
    assert policy is not None and policy.min_silence_s == 0.5


@pytest.mark.parametrize(
    ("strategy", "field"),
    [
        ("manual", "chunking_strategy"),
        ("{not json", "chunking_strategy"),
        (["server_vad"], "chunking_strategy"),
        ({"type": "semantic_vad"}, "chunking_strategy.type"),
        ({"silence_duration_ms": 500}, "chunking_strategy.type"),
        ({"type": "server_vad", "eagerness": "low"}, "chunking_strategy.eagerness"),
        ({"type": "server_vad", "threshold": 1.5}, "chunking_strategy.threshold"),
        ({"type": "server_vad", "threshold": "0.5"}, "chunking_strategy.threshold"),
        ({"type": "server_vad", "threshold": True}, "chunking_strategy.threshold"),
        ({"type": "server_vad", "silence_duration_ms": 0}, "chunking_strategy.silence_duration_ms"),
        ({"type": "server_vad", "silence_duration_ms": 2.5}, "chunking_strategy.silence_duration_ms"),
        ({"type": "server_vad", "silence_duration_ms": "500"}, "chunking_strategy.silence_duration_ms"),
        ({"type": "server_vad", "prefix_padding_ms": -1}, "chunking_strategy.prefix_padding_ms"),
        ({"type": "server_vad", "prefix_padding_ms": float("nan")}, "chunking_strategy.prefix_padding_ms"),
        ({"type": "server_vad", "prefix_padding_ms": 60_000}, "chunking_strategy.prefix_padding_ms"),
    ],
)
def test_bad_strategies_raise_naming_the_field(strategy: Any, field: str) -> None:
    with pytest.raises(ValueError) as caught:
        from_request(strategy, defaults=DEFAULTS)
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"target_s": 0.0}, "target_s"),
        ({"overlap_s": -1.0}, "overlap_s"),
        ({"frame_s": 0.0}, "frame_s"),
        ({"activation": 1.2}, "activation"),
        ({"search_s": 595.0}, "search_s"),
        ({"max_chunk_s": 605.0}, "max_chunk_s"),
        ({"threshold_db": float("inf")}, "threshold_db"),
        ({"min_silence_s": True}, "min_silence_s"),
    ],
)
def test_policy_refuses_inconsistent_values(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ChunkingPolicy(**changes)


def test_policy_as_dict_round_trips() -> None:
    policy = ChunkingPolicy(threshold_db=-50.0, activation=0.3)
    assert ChunkingPolicy(**policy.as_dict()) == policy


DEEP = '{"type": "server_vad", "threshold": ' + "[" * 50_000 + "]" * 50_000 + "}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (DEEP, "characters long"),  # issue 12: 50,000 deep raised RecursionError inside json.loads
        ('{"type": "server_vad", "threshold": ' + "[" * 400 + "]" * 400 + "}", "nested deeper"),
        ('{"type": "server_vad", "x": [[1]]}', "nested deeper"),
        ('{"type": "server_vad", "threshold": 0.5' + " " * 2000 + "}", "characters long"),
        ("auto" + " " * 2000, "characters long"),
    ],
)
def test_oversized_or_deeply_nested_json_is_a_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        from_request(text, defaults=DEFAULTS)


def test_brackets_inside_json_strings_are_not_nesting() -> None:
    """Only structure counts: a quoted bracket (or an escaped quote before it) is text."""
    with pytest.raises(ValueError, match="chunking_strategy.type must be"):
        from_request('{"type": "[[[[\\"[[[[", "threshold": 0.5}', defaults=DEFAULTS)
    policy = from_request('{"type": "server_vad", "threshold": 0.25}', defaults=DEFAULTS)
    assert policy is not None and policy.activation == 0.25
