"""The evaluator's one exception.

The gateway's HTTP errors live in `service/errors.py` (its API contract); the
evaluator is a client and answers no HTTP, so its own failures (a bad manifest, an
unreadable gold file, a server that reports another track than the one asked for)
are one exception class whose message names the file, line or item at fault. The
CLI prints it and exits 2. A transcription the gateway refuses is not an
exception: it is recorded in the report as a failed item with the gateway's code.
"""

from __future__ import annotations


class EvaluationError(Exception):
    """An input or protocol fault that makes the evaluation meaningless; the message says where."""
