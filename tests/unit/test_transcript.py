"""Parsing MOSS output: clean runs, every kind of cut, and garbage that must not raise."""

from __future__ import annotations

import random
import re
import time

import pytest

from service.transcript import (
    ParsedTranscript,
    Segment,
    TextDelta,
    TranscriptParser,
    join_text,
    parse_transcript,
    separator,
)

CLEAN = "[0.48][S01]Welcome everyone[1.66][12.26][S02]The pipeline is ready[13.81]"


def test_clean_output() -> None:
    parsed = parse_transcript(CLEAN)
    assert parsed.segments == (
        Segment(0, 0.48, 1.66, "S01", "Welcome everyone"),
        Segment(1, 12.26, 13.81, "S02", "The pipeline is ready"),
    )
    assert (parsed.incomplete_tail, parsed.tail_text, parsed.ends_inside_tag) == ("", "", False)
    assert parsed.stray_text == () and parsed.anomalies == ()
    assert parsed.last_end == 13.81
    assert parsed.text == "Welcome everyone The pipeline is ready"
    assert parsed.speakers == ("S01", "S02")


def test_cut_exactly_after_an_end_stamp() -> None:
    parsed = parse_transcript("[0.48][S01]Welcome everyone[1.66]")
    assert len(parsed.segments) == 1
    assert (parsed.incomplete_tail, parsed.ends_inside_tag, parsed.last_end) == ("", False, 1.66)


def test_cut_after_the_next_start_stamp() -> None:
    parsed = parse_transcript("[0.48][S01]Welcome everyone[1.66][12.26]")
    assert parsed.incomplete_tail == "[12.26]" and parsed.tail_text == ""
    assert parsed.last_end == 1.66


def test_cut_inside_a_timestamp_tag() -> None:
    parsed = parse_transcript("[3.0][S01]大家好[4.5][5.0][S02]你们的这个[12")
    assert [s.text for s in parsed.segments] == ["大家好"]
    assert parsed.ends_inside_tag
    assert parsed.incomplete_tail == "[5.0][S02]你们的这个[12"
    assert parsed.tail_text == "你们的这个"
    assert parsed.text == "大家好你们的这个"  # CJK pieces join without a space


@pytest.mark.parametrize("cut", ["[3.5][S0", "[3.5][S", "[3.5][", "[3.", "[", "[ 3.5 ][ S0"])
def test_cut_inside_a_header(cut: str) -> None:
    parsed = parse_transcript("[0][S01]ok[1]" + cut)
    assert parsed.ends_inside_tag
    assert parsed.incomplete_tail == cut and parsed.tail_text == ""
    assert parsed.last_end == 1.0 and parsed.text == "ok"


def test_last_segment_without_end_stamp_is_the_tail() -> None:
    parsed = parse_transcript("[0.5][S01]first[1.0][1.2][S02]and then the speaker")
    assert len(parsed.segments) == 1
    assert parsed.incomplete_tail == "[1.2][S02]and then the speaker"
    assert parsed.tail_text == "and then the speaker"
    assert not parsed.ends_inside_tag
    assert parsed.text == "first and then the speaker"


def test_header_without_end_followed_by_a_header() -> None:
    parsed = parse_transcript("[0][S01]hello[1.5][S02]world[2]")
    assert [(s.start, s.end, s.speaker) for s in parsed.segments] == [(0.0, 1.5, "S01"), (1.5, 2.0, "S02")]
    assert any("segment 0" in note and "no end" in note for note in parsed.anomalies)


def test_end_before_start_is_clamped() -> None:
    parsed = parse_transcript("[1][S01]a[2][5.2][S01]b[4.1]")
    assert parsed.segments[1].start == parsed.segments[1].end == 5.2
    assert "segment 1: end 4.10 before start 5.20, end set to start" in parsed.anomalies


def test_stray_text_outside_segments() -> None:
    parsed = parse_transcript("Sure, here it is: [0][S01]hi[1] (laughs) [2][S02]yes[3]")
    assert parsed.stray_text == ("Sure, here it is:", "(laughs)")
    assert parsed.text == "hi yes"


def test_plain_text_without_tags_keeps_its_words() -> None:
    parsed = parse_transcript("  the model forgot every tag  ")
    assert parsed.segments == ()
    assert parsed.stray_text == ("the model forgot every tag",)
    assert parsed.text == "the model forgot every tag"
    assert parsed.last_end is None and parsed.speakers == ()


def test_chinese_multi_speaker_with_integer_stamps() -> None:
    raw = "[0][S01]今天我们讨论模型。[3][4][S02]好的，[S 03] 不对[5][6][S03]我同意[8][9][S01]谢谢[10]"
    parsed = parse_transcript(raw)
    assert [s.speaker for s in parsed.segments] == ["S01", "S02", "S03", "S03", "S01"]
    assert parsed.speakers == ("S01", "S02", "S03")
    assert parse_transcript("[0][S02]a[1][1][S01]b[2][2][S02]c[3]").speakers == ("S02", "S01")
    assert [s.id for s in parsed.segments] == [0, 1, 2, 3, 4]
    assert "今天我们讨论模型。" in parsed.text and "谢谢" in parsed.text


def test_whitespace_inside_and_around_tags() -> None:
    parsed = parse_transcript(" [ 0.5 ] [ S01 ]  spaced out \n [ 1 ]\n[2 ][s2]x[3]")
    assert parsed.segments[0] == Segment(0, 0.5, 1.0, "S01", "spaced out")
    assert parsed.segments[1].speaker == "S2"


def test_stray_timestamp_and_empty_header_are_noted() -> None:
    parsed = parse_transcript("[0][S01][1][1.5][S02]hey[2]")
    assert parsed.segments == (Segment(0, 1.5, 2.0, "S02", "hey"),)
    assert parsed.anomalies


def test_brackets_that_are_not_tags_stay_text() -> None:
    parsed = parse_transcript("[0][S01]he said [inaudible] twice[2]")
    assert parsed.segments[0].text == "he said [inaudible] twice"


def test_empty_string() -> None:
    parsed = parse_transcript("")
    assert parsed == ParsedTranscript((), "", "", False, (), ())
    assert parsed.text == ""


_COMPLETE_TAG = re.compile(r"\[\s*(?:\d+(?:\.\d*)?|\.\d+|[Ss]\s*\d+)\s*\]")
_TRAILING_PARTIAL = re.compile(r"\[\s*(?:\d+(?:\.\d*)?|\.\d*|[Ss]\s*\d*)?\s*\Z")
_PIECES = ["[", "]", "S", "s", "0", "1", "7", ".", " ", "\n", "a", "好"]
_PIECES += ["[0.5]", "[S01]", "[2]", "[S02]", "[1.25]", "x y"]


def _words(parsed: ParsedTranscript) -> str:
    found = [s.text for s in parsed.segments] + list(parsed.stray_text) + [parsed.tail_text]
    return "".join(sorted("".join(found).replace(" ", "").replace("\n", "")))


def test_random_strings_never_raise_and_lose_no_words() -> None:
    rng = random.Random(20240601)
    for _ in range(3000):
        raw = "".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40)))
        parsed = parse_transcript(raw)
        assert [s.id for s in parsed.segments] == list(range(len(parsed.segments)))
        assert all(s.text and s.end >= s.start and s.speaker.startswith("S") for s in parsed.segments)
        assert raw.endswith(parsed.incomplete_tail)
        if parsed.ends_inside_tag:
            assert parsed.incomplete_tail and _TRAILING_PARTIAL.search(raw)
        # Every character outside the tags ends up in a segment, the stray text or the tail.
        expected = _COMPLETE_TAG.sub("", raw)
        if parsed.ends_inside_tag:
            expected = _TRAILING_PARTIAL.sub("", expected)
        kept = "".join(sorted(expected.replace(" ", "").replace("\n", "")))
        assert _words(parsed) == kept, raw


def test_random_bytes_as_text_never_raise() -> None:
    rng = random.Random(5)
    for _ in range(300):
        raw = rng.randbytes(rng.randint(0, 200)).decode("utf-8", errors="replace")
        assert isinstance(parse_transcript(raw), ParsedTranscript)


def test_long_output_parses_in_linear_time() -> None:
    raw = "".join(f"[{i * 2.0:.2f}][S0{i % 3 + 1}]第{i}段 some words[{i * 2 + 1.5:.2f}]" for i in range(8000))
    started = time.perf_counter()
    parsed = parse_transcript(raw + "[16000.00][S01]cut he")
    assert len(parsed.segments) == 8000 and parsed.tail_text == "cut he"
    assert time.perf_counter() - started < 2.0


def test_long_pathological_input_is_fast() -> None:
    raw = "[" + "1" * 100_000 + "[S01" + " " * 100_000 + "[0." + "5" * 100_000
    parsed = parse_transcript(raw * 3)
    assert parsed.segments == ()


# -- the incremental parser: the stream and the final answer are one parse ----------


def _feed_in_pieces(raw: str, rng: random.Random) -> tuple[ParsedTranscript, list[TextDelta], list[Segment]]:
    parser = TranscriptParser()
    deltas: list[TextDelta] = []
    segments: list[Segment] = []
    cursor = 0
    while cursor < len(raw):
        step = rng.randint(1, 6)
        new_deltas, closed = parser.feed(raw[cursor : cursor + step])
        deltas += new_deltas
        segments += closed
        cursor += step
    final = parser.finish()
    new_deltas, closed = parser.take_final()
    return final, deltas + new_deltas, segments + closed


@pytest.mark.parametrize("seed", range(4))
def test_incremental_parse_equals_one_shot_parse(seed: int) -> None:
    rng = random.Random(seed)
    samples = [CLEAN, "[0][S01]今天我们讨论模型。[3][4][S02]好的，[S 03] 不对[5]", "  plain text  ", "[0.5][S01]cut in[1"]
    samples += ["".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    for raw in samples:
        whole = parse_transcript(raw)
        final, deltas, segments = _feed_in_pieces(raw, rng)
        assert final == whole, raw
        assert "".join(d.text for d in deltas) == whole.text, raw
        assert tuple(segments) == whole.segments, raw


def test_deltas_carry_their_segment_and_stream_before_the_segment_closes() -> None:
    parser = TranscriptParser()
    deltas, closed = parser.feed("[0.48][S01]Welcome every")
    assert deltas == [TextDelta("Welcome every", 0)] and closed == []
    deltas, closed = parser.feed("one [1.66][2.0][S02]Next")
    assert [d.text for d in deltas] == ["one", " Next"] and [d.segment for d in deltas] == [0, 1]
    assert closed == [Segment(0, 0.48, 1.66, "S01", "Welcome everyone")]


def test_text_joins_by_script() -> None:
    assert parse_transcript("[0][S01]你好[1][1][S02]世界[2][2][S01]ok then[3]").text == "你好世界ok then"
    assert join_text(["Hello", "world", "你好", "。"]) == "Hello world你好。"
    assert separator("a ", "b") == "" and separator("a", "b") == " "


def test_stray_text_before_segments_is_not_streamed_as_text() -> None:
    parser = TranscriptParser()
    deltas, _ = parser.feed("Sure, here it is: [0][S01]hi[1]")
    final = parser.finish()
    assert "".join(d.text for d in deltas + parser.take_final()[0]) == final.text == "hi"
