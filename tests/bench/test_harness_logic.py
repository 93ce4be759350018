"""CPU tests of the benchmark harness logic (no engine, no GPU)."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from bench import report
from bench.checkpoint import FULL_SIZES, decoder_weight_bytes, kv_bytes_per_token
from bench.stats import add_overheads, summarize
from bench.workloads import (
    PROGRAM_OUTPUT_TOKENS,
    audio_tokens,
    cells_for,
    density_tokens,
    noise_pcm16,
    pcm16_to_float,
    wav_bytes,
)


def test_forced_lengths_follow_the_density_and_the_issue() -> None:
    cells = {c.name: c for c in cells_for(["short", "long", "program", "reference"])}
    assert cells["short-12s-c1"].output_tokens == density_tokens(12.0) == 153
    assert cells["long-600s-c8"].output_tokens == 7650
    assert cells["program-2861.5s-c1"].output_tokens == PROGRAM_OUTPUT_TOKENS == 36_492
    assert cells["reference-300s-c1-1000out"].output_tokens == 1000
    assert {c.concurrency for c in cells.values() if c.workload == "short"} == {1, 4, 16, 64}
    assert {c.concurrency for c in cells.values() if c.name.startswith("long-600s")} == {1, 8}


def test_the_program_needs_the_encoder_budget_of_the_issue() -> None:
    assert audio_tokens(2861.5) == 35_769
    assert audio_tokens(12.0) == 150


def test_smoke_cells_keep_the_structure_but_shrink() -> None:
    full = cells_for(["short"])
    smoke = cells_for(["short"], smoke=True)
    assert [c.name for c in full] == [c.name for c in smoke]
    assert all(s.output_tokens <= 12 and s.concurrency <= 4 for s in smoke)


def test_noise_is_seeded_unique_and_decodes_like_a_wav_reader() -> None:
    a, b, a2 = noise_pcm16(1.0, 1), noise_pcm16(1.0, 2), noise_pcm16(1.0, 1)
    assert np.array_equal(a, a2) and not np.array_equal(a, b)
    data = wav_bytes(a)
    with wave.open(io.BytesIO(data)) as handle:
        assert (handle.getframerate(), handle.getnchannels(), handle.getsampwidth()) == (16_000, 1, 2)
        frames = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
    assert np.array_equal(frames, a)
    sf = pytest.importorskip("soundfile")
    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == 16_000 and np.array_equal(decoded, pcm16_to_float(a))


def _records(latency: float, n: int, tokens: int, ttft: float = 0.05) -> list[dict]:
    return [
        {"status": 200, "latency_s": latency, "ttft_s": ttft, "generated_tokens": tokens, "prompt_tokens": 213}
        for _ in range(n)
    ]


def test_summary_and_gateway_overhead() -> None:
    cell = cells_for(["short"])[0]
    direct = summarize(cell, "direct", 2.0, _records(0.25, 8, cell.output_tokens))
    gateway_records = _records(0.26, 8, cell.output_tokens)
    for r in gateway_records:
        r["server"] = {"total_s": 0.255, "ttft_s": 0.05, "decode_s": 0.2}
    gateway = summarize(cell, "gateway", 2.08, gateway_records)
    rows = [direct, gateway]
    add_overheads(rows)
    assert direct["forced_length_ok"] and direct["audio_s_per_s"] == pytest.approx(8 * 12.0 / 2.0)
    assert direct["rtf_mean"] == pytest.approx(0.25 / 12.0)
    assert gateway["latency_ratio_vs_direct"] == pytest.approx(0.26 / 0.25)
    assert gateway["overhead_ms_vs_direct"] == pytest.approx(10.0)
    breakdown = gateway["breakdown_p50_s"]
    assert breakdown["http_multipart_response"] == pytest.approx(0.005)
    assert breakdown["job_outside_engine"] == pytest.approx(0.005)
    assert breakdown["engine"] == pytest.approx(0.25)
    text = report.render([{"rows": rows, "skipped": [], "gate": {"qualified": True}}])
    assert "short-12s-c1" in text and "+4.0 %" in text
    assert "| cell |" in report.markdown_table([{"rows": rows}])


def test_a_short_forced_length_is_flagged() -> None:
    cell = cells_for(["short"])[0]
    row = summarize(cell, "direct", 1.0, _records(0.25, 2, cell.output_tokens - 1))
    assert row["forced_length_ok"] is False


def test_bandwidth_bound_matches_bench_host() -> None:
    assert kv_bytes_per_token() == 114_688
    assert 1.1e9 < decoder_weight_bytes() < 1.3e9
    assert report.program_bound_s() == pytest.approx(57.0, abs=3.0)
    assert FULL_SIZES["text"]["vocab_size"] == 151_936


def test_padded_tokenizer_keeps_prompts_and_decodes_every_id() -> None:
    from bench.checkpoint import padded_tokenizer
    from service.checkpoint.tokenizer import SPECIAL_TOKENS, build_tokenizer

    base, padded = build_tokenizer(), padded_tokenizer(151_936)
    assert padded.get_vocab_size(with_added_tokens=True) == 151_936
    assert sorted(padded.get_vocab(with_added_tokens=True).values()) == list(range(151_936))
    text = (
        "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>\n请将音频转写为文本 2860 [0.48][S01]Hi<|im_end|>"
    )
    remap = {base.token_to_id(t): padded.token_to_id(t) for t in SPECIAL_TOKENS}
    assert [remap.get(i, i) for i in base.encode(text).ids] == padded.encode(text).ids
    assert padded.decode([600, 151_000]) == " w600 w151000"


def test_fullsize_builder_writes_a_loadable_checkpoint(tmp_path) -> None:
    """The full-size builder at one layer each: the files the engine and the reference load."""
    from transformers import AutoProcessor

    from bench.checkpoint import build_fullsize_checkpoint

    build_fullsize_checkpoint(tmp_path / "ckpt", text_layers=1, audio_layers=1, dtype="float32")
    processor = AutoProcessor.from_pretrained(str(tmp_path / "ckpt"), trust_remote_code=True)
    assert processor.count_prompt_tokens(160_000) == 188  # the 10 s prompt, as the tiny checkpoint counts it
    for name in ("config.json", "processor_config.json", "preprocessor_config.json", "tokenizer.json"):
        assert (tmp_path / "ckpt" / name).is_file()
