"""Private: what only the book build and the tests need, kept out of the public API.

    png            the inline figure PNGs `rlgates.setup` installs in Jupyter: drawn at a scale,
                   re-encoded with a palette, tagged with their pixels per inch and smallest text
                   size (read by the browser test, tests/browser)
    explorer_data  what the static gate explorer (explorer.md) needs, as JSON (scripts/book_web.py)
    facts          what the installed verl and TRL do, read from their files (the chapters' trainer
                   asserts and tests/test_trainer_facts.py)

The public modules use two things here: `rlgates.setup` installs `png`'s figure formatter, and
`rlgates.trainers.guard_notebook` asks `facts.installed()`. Names here may change without notice.
"""
