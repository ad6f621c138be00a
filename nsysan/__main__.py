"""``python -m nsysan``: the same as the ``nsysan`` command."""

from nsysan.cli import main

if __name__ == "__main__":
    main()
