"""The processor: 30 s windows, audio-token counts, time markers, prompt-length helpers."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def processor(hf_reference):
    return hf_reference.processor


def _ids(processor, *tokens: str) -> list[int]:
    return [processor.tokenizer.convert_tokens_to_ids(t) for t in tokens]


def _span(processor, num_samples: int) -> tuple[list[int], dict]:
    audio = np.zeros(num_samples, dtype=np.float32)
    enc = processor(text="<|audio_start|><|audio_pad|><|audio_end|>", audio=[audio], return_tensors="np")
    ids = enc["input_ids"][0].tolist()
    start, end = _ids(processor, "<|audio_start|>", "<|audio_end|>")
    assert ids[0] == start and ids[-1] == end
    return ids[1:-1], enc


def _markers(processor, span: list[int]) -> list[tuple[int, str]]:
    """(number of pads before the marker, marker text) for each run of digit tokens."""
    pad = processor.audio_token_id
    out: list[tuple[int, str]] = []
    pads = 0
    for token in span:
        if token == pad:
            pads += 1
            continue
        text = processor.tokenizer.decode([token])
        assert text.isdigit() and len(text) == 1
        if out and out[-1][0] == pads:
            out[-1] = (pads, out[-1][1] + text)
        else:
            out.append((pads, text))
    return out


def test_saved_processor_settings(processor):
    assert processor.audio_tokens_per_second == 12.5
    assert processor.audio_merge_size == 4
    assert processor.time_marker_every_seconds == 5
    assert processor.enable_time_marker is True
    assert processor.audio_token_id == processor.tokenizer.convert_tokens_to_ids("<|audio_pad|>")
    assert (processor.audio_start_token, processor.audio_end_token) == ("<|audio_start|>", "<|audio_end|>")
    fe = processor.feature_extractor
    assert (fe.feature_size, fe.sampling_rate, fe.hop_length, fe.n_samples) == (80, 16000, 160, 480000)


def test_10s_gives_125_audio_tokens_with_markers_5_and_10(processor):
    span, enc = _span(processor, 160000)
    assert enc["audio_feature_lengths"].tolist() == [125]
    assert enc["input_features"].shape == (1, 80, 3000)
    assert enc["input_features"].dtype == np.float32
    assert span.count(processor.audio_token_id) == 125
    assert _markers(processor, span) == [(62, "5"), (124, "10")]
    assert len(span) == 125 + 1 + 2
    assert span == processor._audio_span_ids(125)


def test_3_2s_gives_40_audio_tokens_and_no_marker(processor):
    span, enc = _span(processor, 51200)
    assert enc["audio_feature_lengths"].tolist() == [40]
    assert span == [processor.audio_token_id] * 40


def test_37s_gives_two_windows_and_seven_markers(processor):
    span, enc = _span(processor, 37 * 16000)
    assert enc["input_features"].shape == (2, 80, 3000)
    assert enc["audio_feature_lengths"].tolist() == [375, 88]
    assert enc["audio_chunk_mapping"].tolist() == [0, 0]
    assert span.count(processor.audio_token_id) == 463
    assert _markers(processor, span) == [(62 * k, str(5 * k)) for k in range(1, 8)]
    assert len(span) == 463 + 1 + 6 * 2


@pytest.mark.parametrize(
    ("num_samples", "expected"),
    [
        (1, [1]),
        (1280, [1]),
        (1281, [2]),
        (160000, [125]),
        (480000, [375]),
        (480001, [375, 1]),
        (960000, [375, 375]),
        (37 * 16000, [375, 88]),
    ],
)
def test_window_token_counts(processor, num_samples, expected):
    assert processor.audio_window_token_counts(num_samples) == expected
    assert processor.count_audio_tokens(num_samples) == sum(expected)


def test_marker_after_exactly_62_tokens_and_none_before(processor):
    pad = processor.audio_token_id
    five = processor.tokenizer.convert_tokens_to_ids("5")
    assert processor._audio_span_ids(61) == [pad] * 61
    assert processor._audio_span_ids(62) == [pad] * 62 + [five]
    assert processor._audio_span_ids(63) == [pad] * 62 + [five, pad]


def test_prompt_helpers_match_the_processor_output(processor, clip_audio, long_audio):
    for audio in (clip_audio, long_audio, clip_audio[:51200]):
        enc = processor(text=processor.build_prompt(), audio=[audio], return_tensors="np")
        ids = enc["input_ids"][0].tolist()
        assert ids == processor.prompt_ids(audio.shape[0])
        assert len(ids) == processor.count_prompt_tokens(audio.shape[0])
        assert enc["attention_mask"][0].tolist() == [1] * len(ids)
    template_only = len(processor.tokenizer.encode(processor.build_prompt(), add_special_tokens=False)) - 1
    assert processor.count_prompt_tokens(160000) == template_only + 128
    span = processor.audio_span_ids_for_samples(160000)
    assert len(span) == 130 and span[1:-1] == processor._audio_span_ids(125)


def test_batch_of_two_prompts_is_left_padded(processor, clip_audio):
    prompt = processor.build_prompt()
    enc = processor(text=[prompt, prompt], audio=[clip_audio, clip_audio[:51200]], return_tensors="pt")
    assert enc["audio_chunk_mapping"].tolist() == [0, 1]
    assert enc["audio_feature_lengths"].tolist() == [125, 40]
    short = processor.count_prompt_tokens(51200)
    long = processor.count_prompt_tokens(160000)
    assert enc["input_ids"].shape == (2, long)
    assert enc["attention_mask"][1].tolist() == [0] * (long - short) + [1] * short


def test_audio_and_placeholder_counts_must_agree(processor, clip_audio):
    with pytest.raises(ValueError):
        processor(text="no placeholder here", audio=[clip_audio])
    with pytest.raises(ValueError):
        processor(text=processor.build_prompt(), audio=[clip_audio], sampling_rate=8000)


def test_text_only_call_leaves_the_placeholder(processor):
    enc = processor(text="<|audio_start|><|audio_pad|><|audio_end|>", return_tensors="np")
    assert enc["input_ids"][0].tolist() == _ids(processor, "<|audio_start|>", "<|audio_pad|>", "<|audio_end|>")
    assert "input_features" not in enc


def test_constructor_default_marker_interval_is_2s(processor):
    cls = type(processor)
    other = cls(processor.feature_extractor, processor.tokenizer)
    assert other.time_marker_every_seconds == 2
    markers = _markers(other, other._audio_span_ids(125))
    assert markers == [(25 * k, str(2 * k)) for k in range(1, 6)]
