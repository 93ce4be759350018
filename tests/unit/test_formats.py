"""SRT and WebVTT rendering: exact output, rounding, and text that could break a cue."""

from __future__ import annotations

import random
import re

import pytest

from service.formats import format_timestamp, render_rttm, render_srt, render_vtt
from service.transcript import Segment, parse_transcript

TWO = (Segment(0, 0.48, 1.66, "S01", "Welcome everyone"), Segment(1, 12.26, 3725.5, "S02", "The pipeline is ready"))


@pytest.mark.parametrize(
    ("seconds", "srt", "vtt"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (1.66, "00:00:01,660", "00:00:01.660"),
        (3661.5, "01:01:01,500", "01:01:01.500"),
        (0.0005, "00:00:00,001", "00:00:00.001"),  # half a millisecond rounds up
        (0.0004, "00:00:00,000", "00:00:00.000"),
        (59.9996, "00:01:00,000", "00:01:00.000"),  # rounding carries into the minute
        (360_000.0, "100:00:00,000", "100:00:00.000"),
        (-3.0, "00:00:00,000", "00:00:00.000"),
        (float("nan"), "00:00:00,000", "00:00:00.000"),
    ],
)
def test_format_timestamp(seconds: float, srt: str, vtt: str) -> None:
    assert format_timestamp(seconds, separator=",") == srt
    assert format_timestamp(seconds, separator=".") == vtt


def test_render_srt() -> None:
    assert render_srt(TWO) == (
        "1\n00:00:00,480 --> 00:00:01,660\n[S01] Welcome everyone\n"
        "\n"
        "2\n00:00:12,260 --> 01:02:05,500\n[S02] The pipeline is ready\n"
    )


def test_render_vtt() -> None:
    assert render_vtt(TWO) == (
        "WEBVTT\n"
        "\n"
        "00:00:00.480 --> 00:00:01.660\n<v S01>Welcome everyone\n"
        "\n"
        "00:00:12.260 --> 01:02:05.500\n<v S02>The pipeline is ready\n"
    )


def test_empty_segments() -> None:
    assert render_srt([]) == ""
    assert render_vtt([]) == "WEBVTT\n"


def test_end_before_start_prints_as_start() -> None:
    backwards = [Segment(0, 5.0, 4.0, "S01", "x")]
    assert "00:00:05,000 --> 00:00:05,000" in render_srt(backwards)
    assert "00:00:05.000 --> 00:00:05.000" in render_vtt(backwards)


def test_text_that_would_break_a_cue_is_cleaned() -> None:
    tricky = [Segment(0, 0.0, 1.0, "S01", "a --> b\n\n  <i>&c</i>  \nd")]
    srt = render_srt(tricky)
    assert srt == "1\n00:00:00,000 --> 00:00:01,000\n[S01] a -> b\n<i>&c</i>\nd\n"
    vtt = render_vtt(tricky)
    assert vtt.endswith("<v S01>a --&gt; b\n&lt;i&gt;&amp;c&lt;/i&gt;\nd\n")
    assert "\n\n\n" not in srt and vtt.count("-->") == 1


def test_renders_parser_output() -> None:
    parsed = parse_transcript("[0.5][S01]大家好[1.25][2][S02]你好[3]")
    assert render_srt(parsed.segments).splitlines()[2] == "[S01] 大家好"
    assert render_vtt(parsed.segments).splitlines()[-1] == "<v S02>你好"


_TIMING = re.compile(r"(\d+):(\d\d):(\d\d)[,.](\d{3}) --> (\d+):(\d\d):(\d\d)[,.](\d{3})")


def _ms(parts: tuple[str, ...]) -> int:
    hours, minutes, seconds, millis = map(int, parts)
    return ((hours * 60 + minutes) * 60 + seconds) * 1000 + millis


def test_printed_end_never_precedes_printed_start() -> None:
    rng = random.Random(99)
    segments = []
    for index in range(500):
        start = rng.choice([rng.uniform(0, 7200), round(rng.uniform(0, 100), 4) + 0.0005])
        end = start + rng.choice([0.0, 1e-9, 0.0004, 0.0005, rng.uniform(0, 5)])
        segments.append(Segment(index, start, end, "S01", "x"))
    for rendered in (render_srt(segments), render_vtt(segments)):
        timings = _TIMING.findall(rendered)
        assert len(timings) == len(segments)
        for timing, segment in zip(timings, segments, strict=True):
            start_ms, end_ms = _ms(timing[:4]), _ms(timing[4:])
            assert start_ms <= end_ms
            assert abs(start_ms - segment.start * 1000) <= 0.5 + 1e-6


def test_render_rttm() -> None:
    assert render_rttm(TWO, "meeting") == (
        "SPEAKER meeting 1 0.480 1.180 <NA> <NA> S01 <NA> <NA>\n"
        "SPEAKER meeting 1 12.260 3713.240 <NA> <NA> S02 <NA> <NA>\n"
    )


def test_rttm_fields_stay_single_tokens() -> None:
    renamed = [Segment(0, 0.0005, 2.0, "Ada  Lovelace", "x"), Segment(1, 2.0, 3.0, " ", "y")]
    lines = render_rttm(renamed, "my file.wav").splitlines()
    assert lines == [
        "SPEAKER my_file.wav 1 0.001 1.999 <NA> <NA> Ada_Lovelace <NA> <NA>",
        "SPEAKER my_file.wav 1 2.000 1.000 <NA> <NA> unknown <NA> <NA>",
    ]
    assert all(len(line.split()) == 10 for line in lines)
    assert render_rttm(TWO[:1], "").split()[1] == "audio"


def test_rttm_leaves_out_empty_turns_and_agrees_with_srt() -> None:
    segments = [Segment(0, 5.0, 4.0, "S01", "backwards"), Segment(1, 6.0, 6.0004, "S02", "instant"), *TWO]
    assert render_rttm([], "f") == ""
    rttm = render_rttm(segments, "f").splitlines()
    assert [line.split()[7] for line in rttm] == ["S01", "S02"]
    srt_times = [_ms(t[:4]) for t in _TIMING.findall(render_srt(TWO))]
    assert [round(float(line.split()[3]) * 1000) for line in rttm] == srt_times
