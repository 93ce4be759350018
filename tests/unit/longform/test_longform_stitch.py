"""Stitching chunk transcripts: one copy per overlap segment, the right copy, gaps reported."""

from __future__ import annotations

import json

import pytest

from service.longform.cuts import Cut
from service.longform.matching import text_similarity, time_score, tokens
from service.longform.stitch import ChunkTranscript, StitchedTranscript, stitch
from service.transcript import parse_transcript

Spec = tuple[float, float, str, str]  # global start, global end, local speaker, text
SPANS = [(0.0, 600.0), (590.0, 1200.0), (1190.0, 1800.0)]


def chunk(index: int, segments: list[Spec], *, stop: str = "eos", tail: str = "") -> ChunkTranscript:
    """A chunk as the model would write it: times local to the chunk start."""
    start, end = SPANS[index]
    raw = "".join(f"[{a - start:.2f}][{spk}]{text}[{b - start:.2f}]" for a, b, spk, text in segments) + tail
    return ChunkTranscript(Cut(index, start, end), parse_transcript(raw), stop)


def texts(result: StitchedTranscript) -> list[str]:
    return [segment.text for segment in result.segments]


def test_segments_are_offset_to_global_time_and_renumbered() -> None:
    result = stitch([chunk(0, [(10.0, 12.0, "S01", "hello there")]), chunk(1, [(700.0, 702.5, "S01", "later on")])])
    assert [(s.id, s.chunk, s.start, s.end, s.speaker) for s in result.segments] == [
        (0, 0, 10.0, 12.0, "S01"),
        (1, 1, 700.0, 702.5, "S01"),
    ]
    assert result.text == "hello there later on"
    assert result.chunk_speakers == (("S01",), ("S01",))


def test_duplicates_keep_exactly_one_copy_the_one_farther_from_its_edge() -> None:
    left = chunk(
        0,
        [
            (500.0, 505.0, "S01", "welcome back to the show"),
            (591.0, 594.0, "S01", "we should ship it on friday"),
            (597.0, 599.2, "S02", "sounds good to me then"),
        ],
    )
    right = chunk(
        1,
        [
            (591.1, 594.1, "S01", "We should ship it on Friday."),
            (597.1, 599.3, "S02", "Sounds good to me, then."),
            (620.0, 625.0, "S02", "let us talk about the budget"),
        ],
    )
    result = stitch([left, right])
    assert [t.lower().rstrip(".") for t in texts(result)] == [
        "welcome back to the show",
        "we should ship it on friday",
        "sounds good to me, then",
        "let us talk about the budget",
    ]
    ship, sounds = result.segments[1], result.segments[2]
    assert ship.chunk == 0  # 6 s from chunk 0's end vs 1.1 s from chunk 1's start
    assert sounds.chunk == 1  # 0.8 s from chunk 0's end vs 7.1 s from chunk 1's start
    report = result.overlaps[0]
    assert len(report.pairs) == 2 and len(report.dropped) == 2
    assert all(pair.text_score >= 0.9 and pair.time_score >= 0.9 for pair in report.pairs)
    assert {(pair.left.local_id, pair.right.local_id, pair.kept_chunk) for pair in report.pairs} == {
        (1, 0, 0),
        (2, 1, 1),
    }


def test_a_segment_spanning_the_cut_comes_out_once_and_whole() -> None:
    left = chunk(0, [(580.0, 584.0, "S01", "right so"), (596.0, 600.0, "S02", "and then we went")])
    right = chunk(1, [(596.0, 602.5, "S01", "and then we went home together"), (603.0, 606.0, "S02", "nice")])
    result = stitch([left, right])
    spanning = [s for s in result.segments if "then we went" in s.text]
    assert len(spanning) == 1
    assert (spanning[0].chunk, spanning[0].start, spanning[0].end) == (1, 596.0, 602.5)
    assert spanning[0].text == "and then we went home together"
    assert [(s.chunk, s.local_id) for s in result.overlaps[0].dropped] == [(0, 1)]


def test_a_segment_clipped_at_the_next_chunks_start_keeps_the_earlier_whole_copy() -> None:
    left = chunk(0, [(587.5, 592.0, "S01", "we really should ship it on friday")])
    right = chunk(1, [(590.0, 592.0, "S01", "should ship it on friday"), (595.0, 597.0, "S01", "okay")])
    result = stitch([left, right])
    assert texts(result) == ["we really should ship it on friday", "okay"]
    assert result.segments[0].chunk == 0


def test_a_segment_without_a_counterpart_is_never_dropped() -> None:
    left = chunk(0, [(591.0, 594.0, "S01", "we should ship it on friday"), (595.0, 596.0, "S02", "agreed")])
    right = chunk(1, [(591.0, 594.0, "S01", "we should ship it on friday"), (596.5, 597.5, "S02", "hmm right")])
    result = stitch([left, right])
    assert texts(result) == ["we should ship it on friday", "agreed", "hmm right"]
    assert len(result.overlaps[0].dropped) == 1


def test_unrelated_speech_at_the_same_time_is_not_a_duplicate() -> None:
    left = chunk(0, [(592.0, 595.0, "S01", "the budget is due next week")])
    right = chunk(1, [(592.2, 595.1, "S02", "did anyone book the meeting room")])
    result = stitch([left, right])
    assert len(result.segments) == 2 and result.overlaps[0].pairs == ()


def test_one_segment_matching_two_of_the_other_chunk_keeps_one_side_whole() -> None:
    left = chunk(0, [(594.0, 599.5, "S01", "we should ship it on friday and then tell the whole team")])
    right = chunk(
        1,
        [(594.0, 597.0, "S01", "we should ship it on friday"), (597.0, 599.5, "S01", "and then tell the whole team")],
    )
    result = stitch([left, right])
    assert len(result.segments) == 2 and {s.chunk for s in result.segments} == {1}
    assert len(result.overlaps[0].pairs) == 2 and [s.chunk for s in result.overlaps[0].dropped] == [0]


def test_a_chunk_stopped_by_max_tokens_does_not_replace_the_next_chunks_complete_segment() -> None:
    left = chunk(
        0,
        [(550.0, 553.0, "S01", "first point done"), (591.0, 593.5, "S01", "we should ship it")],
        stop="max_tokens",
        tail="[593.50][S01]on fri",
    )
    right = chunk(1, [(591.0, 596.0, "S01", "we should ship it on friday and go home")])
    result = stitch([left, right])
    assert texts(result) == ["first point done", "we should ship it on friday and go home"]
    report = result.overlaps[0]
    assert report.left_stopped_early and report.left_coverage_end_s == 593.5
    assert [(s.chunk, s.local_id) for s in report.dropped] == [(0, 1)]
    assert report.gap is not None and result.gaps == (report.gap,)
    gap = report.gap
    assert (gap.chunk, gap.start_s, gap.end_s, gap.lost_s, gap.stop) == (0, 593.5, 600.0, 0.0, "max_tokens")
    assert gap.tail_text == "on fri" and "max_tokens" in gap.reason


def test_coverage_ending_before_the_overlap_reports_the_lost_audio_and_keeps_the_next_chunk() -> None:
    left = chunk(0, [(570.0, 580.0, "S01", "and that is why")], stop="max_tokens", tail="[581.00][S01]the budget")
    right = chunk(1, [(590.5, 593.0, "S01", "was cut in half"), (594.0, 598.0, "S02", "really")])
    result = stitch([left, right])
    assert texts(result) == ["and that is why", "was cut in half", "really"]
    (gap,) = result.gaps
    assert (gap.start_s, gap.end_s, gap.lost_s, gap.tail_text) == (580.0, 600.0, 10.0, "the budget")


def test_a_last_chunk_that_stopped_early_reports_its_uncovered_tail() -> None:
    last = chunk(1, [(600.0, 640.0, "S01", "a long answer")], stop="max_tokens")
    result = stitch([chunk(0, [(592.0, 594.0, "S01", "hi")]), last])
    assert [(g.chunk, g.start_s, g.end_s, g.lost_s) for g in result.gaps] == [(1, 640.0, 1200.0, 560.0)]


def test_a_complete_chain_reports_no_gaps() -> None:
    def words(i: int) -> Spec:  # said just before the cut after chunk i, so chunks i and i + 1 both hear it
        return (SPANS[i][1] - 6.0, SPANS[i][1] - 2.0, "S01", f"closing words of part number {i}")

    chunks = [chunk(0, [words(0)]), chunk(1, [words(0), words(1)]), chunk(2, [words(1)])]
    result = stitch(chunks)
    assert result.gaps == () and [o.left_stopped_early for o in result.overlaps] == [False, False]
    assert texts(result) == ["closing words of part number 0", "closing words of part number 1"]


def test_chunks_are_ordered_by_index_and_must_be_complete() -> None:
    first, second = chunk(0, [(1.0, 2.0, "S01", "one")]), chunk(1, [(700.0, 701.0, "S01", "two")])
    assert texts(stitch([second, first])) == ["one", "two"]
    with pytest.raises(ValueError, match="numbered"):
        stitch([first, chunk(2, [])])
    assert stitch([]).segments == ()


def test_times_beyond_the_chunk_are_clamped_and_noted() -> None:
    result = stitch([chunk(0, [(598.0, 603.0, "S01", "overrun")])])
    assert (result.segments[0].start, result.segments[0].end) == (598.0, 600.0)
    assert len(result.notes) == 1 and "clamped" in result.notes[0]


def test_report_is_json_ready() -> None:
    left = chunk(0, [(591.0, 594.0, "S01", "we should ship it on friday")], stop="max_tokens")
    right = chunk(1, [(591.0, 594.0, "S01", "we should ship it on friday")])
    data = json.loads(json.dumps(stitch([left, right]).as_dict()))
    assert data["text"] == "we should ship it on friday"
    assert data["overlaps"][0]["pairs"][0]["kept_chunk"] == 1
    assert data["gaps"][0]["stop"] == "max_tokens"


def test_text_and_time_scores() -> None:
    assert tokens("Hello, World! 你好世界") == ("hello", "world", "你", "好", "世", "界")
    assert text_similarity("We should ship it.", "we should ship it") == 1.0
    assert text_similarity("and then we went", "and then we went home together") == 1.0
    assert text_similarity("the budget is due next week", "did anyone book the meeting room") < 0.3
    assert text_similarity("yes", "yes I think so") < 0.5  # one shared word is not containment evidence
    assert text_similarity("", "anything") == 0.0
    assert time_score(0.0, 2.0, 1.0, 3.0) == pytest.approx(1.6 / 2.6)
    assert time_score(0.0, 1.0, 5.0, 6.0) == 0.0
