"""The evaluation corpus: labelled traces scored per finding code (tests/eval, issue 19).

It drives whole analyses (`nsysan.api`, multi-rank jobs), so it sits above the library layers
and below the CLI; the synthetic trace builders it uses live in `nsysan.testing` and
`nsysan.evaluation.planted`. Run ``python -m nsysan.evaluation --write bench/eval_scores.md``.
"""
