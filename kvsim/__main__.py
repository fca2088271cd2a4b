"""``python -m kvsim`` is the same as the ``kvsim`` console script."""

from kvsim.cli import main

if __name__ == "__main__":
    main()
