#!/usr/bin/env python3
"""Write the README's method table from the registry (`rlgates.tables.methods_table`).

    python scripts/readme_methods.py          rewrite the table between the README's markers
    python scripts/readme_methods.py --check  exit 1 if the README's table is not the generated one

A method added as one class reaches the README by running this once; tests/test_plane.py fails
until then.
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- methods table: written by scripts/readme_methods.py from the registry -->"
END = "<!-- end of the methods table -->"


def generated(text: str) -> str:
    """`text` (the README) with the table between BEGIN and END replaced by the generated one."""
    from rlgates.tables import methods_table

    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ValueError(f"README.md must hold the markers {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n\n{methods_table()}\n\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    new = generated(text)
    if "--check" in argv:
        if new != text:
            print("README.md's method table is stale: run python scripts/readme_methods.py")
            return 1
        return 0
    README.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
