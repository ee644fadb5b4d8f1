"""The test suite. A package, so that `tests.conftest` is ours: verl installs a top-level
`tests` package into site-packages, which would otherwise shadow this folder."""
