"""`moss-gateway evaluate`: how good the transcripts are, per track, against gold.

The evaluator is a client of a running gateway: it talks to it over HTTP only
(`client.py`) and never imports the transcription package, so what it measures
is what a user of the API gets. One concept per module:

- `errors`: the one exception the evaluator raises for its own failures;
- `gold`: reference segments and the SegLST JSON, STM and RTTM readers/writers;
- `manifest`: the JSON Lines manifest (one item a line);
- `normalise`: the text normalisation applied identically to gold and hypothesis;
- `assignment`: minimum-cost one-to-one assignment (speaker mappings);
- `metrics`: CER/WER, cpCER/cpWER, DER/JER, boundaries, speakers, coverage, drift;
- `stats`: seeded bootstrap confidence intervals and the paired bootstrap test;
- `windows`: frozen cut points and the gold and audio of each window;
- `protocol`: the scoring parameters recorded with each report;
- `arguments`, `command`: the `moss-gateway evaluate` subcommand;
- `client`: one transcription request per track, with its stop evidence and backend;
- `runner`: runs a manifest and scores it;
- `report`: report.json and the Markdown report;
- `compare`: two reports side by side with paired significance;
- `plots`: per-window CER, coverage and drift over time (matplotlib, headless);
- `goldset`: the synthetic espeak-ng gold set the project makes itself.
"""
