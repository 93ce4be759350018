"""Transcription below HTTP: params -> job -> track (native or chunked) -> engine passes.

Imports go one way: `pipeline` uses `tracks`, which use `engine_pass`, which
uses the engine protocol; `job`, `params`, `segment_stats` and `accountant` are
leaves they share. Nothing here knows about HTTP.
"""
