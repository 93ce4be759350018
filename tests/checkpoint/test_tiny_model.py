"""The Transformers reference: greedy output on the frozen clip, generate() plumbing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qualification.clip import FROZEN_CLIP_TRANSCRIPT


@pytest.fixture(scope="module")
def expected_ids(hf_reference) -> list[int]:
    tok = hf_reference.tokenizer
    return tok.encode(FROZEN_CLIP_TRANSCRIPT, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]


def test_greedy_writes_the_frozen_transcript_then_im_end(hf_reference, clip_audio, expected_ids):
    enc, out = hf_reference.greedy(clip_audio, max_new_tokens=len(expected_ids) + 20)
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    assert new == expected_ids  # stopped on <|im_end|> by the generation config's eos list
    text = hf_reference.tokenizer.decode(new, skip_special_tokens=True)
    assert text == FROZEN_CLIP_TRANSCRIPT


def test_generate_returns_scores_and_logits(hf_reference, clip_audio, expected_ids):
    enc, out = hf_reference.greedy(
        clip_audio,
        max_new_tokens=len(expected_ids),
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    new = out.sequences[0, enc["input_ids"].shape[1] :]
    assert len(out.scores) == len(out.logits) == new.shape[0] == len(expected_ids)
    assert torch.stack(out.logits)[:, 0].argmax(-1).tolist() == new.tolist()
    top2 = torch.stack(out.logits)[:, 0].topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1.0  # clear greedy margins: parity is robust


def test_silence_gives_an_empty_transcript(hf_reference):
    enc, out = hf_reference.greedy(np.zeros(160000, dtype=np.float32), max_new_tokens=8)
    assert out[0, enc["input_ids"].shape[1] :].tolist() == [hf_reference.tokenizer.convert_tokens_to_ids("<|im_end|>")]


def test_output_depends_on_the_audio(hf_reference, clip_audio, noise_audio, expected_ids):
    im_end = hf_reference.tokenizer.convert_tokens_to_ids("<|im_end|>")
    enc, clip_out = hf_reference.greedy(clip_audio, max_new_tokens=len(expected_ids) + 4)
    _, noise_out = hf_reference.greedy(noise_audio, max_new_tokens=len(expected_ids) + 4)
    n = enc["input_ids"].shape[1]  # same prompt length: both are 10 s
    assert clip_out[0, n:].tolist() == expected_ids
    assert noise_out[0, n:].tolist() == [im_end]  # an unseen noise: no speech, empty transcript


def test_audio_is_encoded_once_on_prefill(hf_reference, clip_audio):
    calls: list[tuple[int, ...]] = []
    encoder = hf_reference.model.model.whisper_encoder
    handle = encoder.register_forward_hook(lambda _m, args, _o: calls.append(tuple(args[0].shape)))
    try:
        hf_reference.greedy(clip_audio, max_new_tokens=12, min_new_tokens=12)
    finally:
        handle.remove()
    assert calls == [(1, 80, 3000)]


def test_forward_checks_the_placeholder_count(hf_reference, clip_audio):
    enc = hf_reference.inputs(clip_audio)
    with torch.no_grad():
        logits = hf_reference.model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], hf_reference.model.config.text_config.vocab_size)
    bad = dict(enc)
    bad["audio_feature_lengths"] = enc["audio_feature_lengths"] - 1
    with pytest.raises(ValueError):
        with torch.no_grad():
            hf_reference.model(**bad)


def test_lm_head_is_tied_and_automodel_gives_the_body(hf_reference, tiny_checkpoint):
    from transformers import AutoModel

    model = hf_reference.model
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert model.dtype == torch.float32
    body = AutoModel.from_pretrained(str(tiny_checkpoint), trust_remote_code=True)
    assert type(body).__name__ == "MossTranscribeDiarizeModel"
    assert torch.equal(body.vq_adaptor.layers[0].weight, model.model.vq_adaptor.layers[0].weight)


def test_the_recovery_lessons_are_learned(hf_reference, clip_audio):
    """The tail recovery test's three inputs (build.recovery_lessons): clip + silence and clip + tail clip give
    the clip's transcript (the second is an early stop), the further pass from the frozen cut gives the tail."""
    from qualification.clip import TAIL_CLIP_PATH
    from service.checkpoint.build import load_clip, recovery_lessons

    tok = hf_reference.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    lessons = recovery_lessons(clip_audio, load_clip(TAIL_CLIP_PATH))
    assert [text for _, text in lessons][:2] == [FROZEN_CLIP_TRANSCRIPT] * 2
    assert lessons[2][1].startswith("[0.00][S01]Thank you, see you soon.[1.00][2.16][S01]Now the weather report.")
    for audio, text in lessons:
        expected = tok.encode(text, add_special_tokens=False) + [im_end]
        enc, out = hf_reference.greedy(audio, max_new_tokens=len(expected) + 8)
        assert out[0, enc["input_ids"].shape[1] :].tolist() == expected
