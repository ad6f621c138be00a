"""``python -m nsysan.evaluation``: score the corpus (see `nsysan.evaluation.corpus`)."""

from nsysan.evaluation.corpus import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
