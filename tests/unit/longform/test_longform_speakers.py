"""Linking chunk-local speakers through the overlaps into global speakers."""

from __future__ import annotations

import json

from service.longform.cuts import Cut
from service.longform.speakers import LinkedSpeakers, link_speakers
from service.longform.stitch import ChunkTranscript, stitch
from service.transcript import Segment, parse_transcript

Spec = tuple[float, float, str, str]  # global start, global end, local speaker, text
SPANS = [(0.0, 600.0), (590.0, 1200.0), (1190.0, 1800.0)]
ALICE_0 = "so what do we do about the launch date"
BOB_0 = "we move it to next month and tell the team"
ALICE_1 = "fine but marketing needs a new plan by then"
BOB_1 = "i will write it up and send it around tomorrow"


def chunk(index: int, segments: list[Spec], *, stop: str = "eos") -> ChunkTranscript:
    start, end = SPANS[index]
    raw = "".join(f"[{a - start:.2f}][{spk}]{text}[{b - start:.2f}]" for a, b, spk, text in segments)
    return ChunkTranscript(Cut(index, start, end), parse_transcript(raw), stop)


def linked(*chunks: ChunkTranscript) -> LinkedSpeakers:
    return link_speakers(stitch(chunks))


def speaker_of(result: LinkedSpeakers, text: str) -> str:
    (segment,) = [s for s in result.segments if s.text == text]
    return segment.speaker


def test_a_speaker_swap_across_the_cut_keeps_each_person_one_global_speaker() -> None:
    # Alice is S01 in chunk 0 but S02 in chunk 1; Bob the other way round.
    result = linked(
        chunk(
            0,
            [(100.0, 104.0, "S01", "hello and welcome"), (591.0, 594.0, "S01", ALICE_0), (594.5, 598.5, "S02", BOB_0)],
        ),
        chunk(
            1,
            [
                (591.0, 594.0, "S02", ALICE_0),
                (594.5, 598.5, "S01", BOB_0),
                (605.0, 609.0, "S02", "alice speaks again here"),
                (610.0, 614.0, "S01", "bob answers her"),
            ],
        ),
    )
    assert result.mapping == {(0, "S01"): "S01", (0, "S02"): "S02", (1, "S02"): "S01", (1, "S01"): "S02"}
    assert speaker_of(result, "alice speaks again here") == "S01"
    assert speaker_of(result, "bob answers her") == "S02"
    (overlap,) = result.overlaps
    assert all(link.accepted for link in overlap.links) and len(overlap.links) == 2
    alice = next(link for link in overlap.links if link.left_speaker == "S01")
    assert (alice.right_speaker, alice.segments, alice.seconds, alice.mean_similarity) == ("S02", 1, 3.0, 1.0)
    assert 0.7 < alice.confidence <= 1.0 and alice.purity == 1.0
    assert overlap.confidence == min(link.confidence for link in overlap.links)
    assert result.notes == ()


def test_three_chunks_with_a_consistent_chain_share_global_speakers() -> None:
    result = linked(
        chunk(0, [(591.0, 594.0, "S01", ALICE_0), (594.5, 598.5, "S02", BOB_0)]),
        chunk(
            1,
            [
                (591.0, 594.0, "S02", ALICE_0),
                (594.5, 598.5, "S01", BOB_0),
                (1191.0, 1194.0, "S02", ALICE_1),
                (1194.5, 1198.5, "S01", BOB_1),
            ],
        ),
        chunk(
            2,
            [(1191.0, 1194.0, "S01", ALICE_1), (1194.5, 1198.5, "S02", BOB_1), (1300.0, 1303.0, "S01", "alice closes")],
        ),
    )
    assert result.mapping == {
        (0, "S01"): "S01",
        (0, "S02"): "S02",
        (1, "S02"): "S01",
        (1, "S01"): "S02",
        (2, "S01"): "S01",
        (2, "S02"): "S02",
    }
    assert [s.speaker for s in result.segments] == ["S01", "S02", "S01", "S02", "S01"]
    assert result.speakers == ("S01", "S02")
    assert [o.confidence > 0.7 for o in result.overlaps] == [True, True]


def test_an_overlap_without_speech_keeps_the_speakers_apart_with_zero_confidence() -> None:
    result = linked(
        chunk(0, [(500.0, 580.0, "S01", "a long monologue that ends early")]),
        chunk(1, [(605.0, 620.0, "S01", "after the break"), (621.0, 630.0, "S02", "a second voice")]),
    )
    (overlap,) = result.overlaps
    assert overlap.links == () and overlap.confidence == 0.0
    assert "no matched speech" in overlap.note
    assert result.mapping == {(0, "S01"): "S01", (1, "S01"): "S02", (1, "S02"): "S03"}
    assert len(result.notes) == 2 and all("kept apart" in note for note in result.notes)


def test_weak_evidence_is_not_enough_to_link() -> None:
    result = linked(
        chunk(0, [(592.0, 592.5, "S01", "yeah right")]),
        chunk(1, [(592.0, 592.5, "S01", "yeah right"), (600.0, 604.0, "S01", "so anyway")]),
    )
    (link,) = result.overlaps[0].links
    assert not link.accepted and link.confidence < 0.5 and "weak evidence" in link.reason
    assert result.mapping[(1, "S01")] == "S02"
    assert 0.0 < result.overlaps[0].confidence < 0.5


def test_split_votes_are_conflicting_and_keep_speakers_apart() -> None:
    # Chunk 1 gives one chunk-0 speaker's two sentences to two different labels.
    result = linked(
        chunk(0, [(591.0, 594.0, "S01", ALICE_0), (594.5, 597.5, "S01", ALICE_1)]),
        chunk(1, [(591.0, 594.0, "S01", ALICE_0), (594.5, 597.5, "S02", ALICE_1)]),
    )
    links = result.overlaps[0].links
    assert len(links) == 2 and not any(link.accepted for link in links)
    assert all(link.purity == 0.5 and "conflicting votes" in link.reason for link in links)
    # Chunk 1's S01 copy was dropped as a duplicate, so its S02 appears first and is numbered first.
    assert result.mapping == {(0, "S01"): "S01", (1, "S02"): "S02", (1, "S01"): "S03"}
    assert [s.speaker for s in result.segments] == ["S01", "S02"]


def test_the_stronger_vote_wins_and_the_weaker_is_reported_as_a_conflict() -> None:
    result = linked(
        chunk(0, [(590.5, 596.5, "S01", ALICE_0 + " " + BOB_0), (597.0, 598.5, "S01", "ok")]),
        chunk(1, [(590.5, 596.5, "S01", ALICE_0 + " " + BOB_0), (597.0, 598.5, "S02", "ok")]),
    )
    strong, weak = result.overlaps[0].links
    assert (strong.left_speaker, strong.right_speaker, strong.accepted) == ("S01", "S01", True)
    assert (weak.left_speaker, weak.right_speaker, weak.accepted) == ("S01", "S02", False)
    assert weak.reason == "conflict: S01 already linked to S01"
    assert result.mapping[(1, "S01")] == "S01" and result.mapping[(1, "S02")] == "S02"


def test_relabelled_segments_are_transcript_segments_and_evidence_is_json_ready() -> None:
    result = linked(
        chunk(0, [(591.0, 594.0, "S01", ALICE_0)]),
        chunk(1, [(591.0, 594.0, "S03", ALICE_0), (700.0, 702.0, "S03", "more")]),
    )
    assert result.segments == (Segment(0, 591.0, 594.0, "S01", ALICE_0), Segment(1, 700.0, 702.0, "S01", "more"))
    data = json.loads(json.dumps(result.as_dict()))
    assert {"chunk": 1, "local": "S03", "global": "S01"} in data["mapping"]
    assert data["overlaps"][0]["links"][0]["right_speaker"] == "S03"


def test_global_labels_follow_first_appearance_in_the_transcript() -> None:
    # The model lists S01 first in its text, but S02's segment is earlier in time: S02 becomes global S01.
    raw = "[50.00][S01]written first said later[52.00][10.00][S02]said first[12.00]"
    result = link_speakers(stitch([ChunkTranscript(Cut(0, 0.0, 600.0), parse_transcript(raw), "eos")]))
    assert result.mapping == {(0, "S01"): "S02", (0, "S02"): "S01"}
    assert [(s.text, s.speaker) for s in result.segments] == [
        ("said first", "S01"),
        ("written first said later", "S02"),
    ]
