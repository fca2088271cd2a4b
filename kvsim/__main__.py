"""``python -m kvsim`` and the ``kvsim`` console script (``kvsim.__main__:main``).

The entry point imports the command line itself, so that Ctrl-C or SIGTERM during the
imports (numpy, pandas, typer: a second or more) ends with one line, not a traceback of
the import machinery."""

import os
import signal
import sys


def _stop(message: str, code: int) -> None:
    try:
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


def main() -> None:
    try:
        from kvsim.core.errors import Terminated

        def on_sigterm(signum, frame):
            raise Terminated()

        signal.signal(signal.SIGTERM, on_sigterm)
        try:
            from kvsim.cli import main as cli_main
        except Terminated:
            _stop("terminated (SIGTERM) while starting; nothing was written", 143)
    except KeyboardInterrupt:
        _stop("interrupted (Ctrl-C) while starting; nothing was written", 130)
    cli_main()


if __name__ == "__main__":
    main()
