"""Qualification: proving that a serving backend reproduces the Transformers reference.

`reference` runs the instrumented Transformers model, `parity` compares token IDs,
`records` seals verdicts bound to a backend fingerprint, `runner` does one whole
qualification against the serving engine, `clip` is the frozen 10 s clip.
"""
