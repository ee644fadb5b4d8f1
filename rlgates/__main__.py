"""python -m rlgates COMMAND ...: the library's command line.

    python -m rlgates inspect RUN     # inspect a capture of your own run (rlgates.inspect)
"""

from __future__ import annotations

import os
import sys

COMMANDS = {"inspect": "inspect a capture of a training run (python -m rlgates inspect --help)"}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        # --help asked for it (stdout, status 0); no command is a usage error (stderr, 2)
        out = sys.stdout if argv else sys.stderr
        print("usage: python -m rlgates COMMAND [ARGS]\n\ncommands:", file=out)
        for name, doc in COMMANDS.items():
            print(f"  {name:10s} {doc}", file=out)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"rlgates: unknown command {argv[0]!r}; commands: {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    from .inspect.cli import main as inspect_main

    return inspect_main(argv[1:])


def run() -> int:
    """main(), with a reader that stops reading (`... | head`) ending the command quietly, with
    the status a shell gives a process that SIGPIPE ends (128 + 13)."""
    try:
        status = main()
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141


if __name__ == "__main__":
    sys.exit(run())
