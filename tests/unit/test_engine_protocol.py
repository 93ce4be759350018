"""EngineTimings (service/engine/protocol.py): the derived durations and the pass's one-phrase summary."""

from __future__ import annotations

from service.engine.protocol import EngineTimings


def test_summary_names_every_measured_part_in_order() -> None:
    timings = EngineTimings(
        submitted=10.0, rendered=10.25, first_token=10.5, finished=16.0,
        engine_queue_s=0.01, engine_prefill_s=0.2, engine_decode_s=5.4,
    )
    assert timings.render_s == 0.25
    assert timings.summary() == (
        "features 0.25 s, first token 0.50 s, engine queue 0.01 s, prefill 0.20 s, decode 5.40 s"
    )


def test_summary_leaves_out_what_was_not_measured() -> None:
    timings = EngineTimings(submitted=3.0, first_token=4.0)
    assert timings.render_s is None
    assert timings.summary() == "first token 1.00 s"
    assert EngineTimings(submitted=0.0).summary() == ""
