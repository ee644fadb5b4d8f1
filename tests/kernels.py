"""Jupyter kernels as a reader on Colab or Binder has them, for the tests of the reader
notebooks (tests/test_reader_notebooks.py, tests/browser/test_jupyterlab.py): modules that
cannot be imported, and a repository that cannot be reached."""

from __future__ import annotations

from rlgates.trainers import _guard

#: what Binder's light environment lacks (binder/requirements.txt): the trainers and what comes
#: with them, as the trainer cells' guard names them
TRAINER_MODULES = sorted(_guard.TRAINER_PACKAGES | _guard.COMES_WITH_THEM)


def hide_from_kernels(tmp_path, monkeypatch, modules) -> None:
    """Kernels started from here on cannot import `modules` (an IPython startup file)."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-missing.py").write_text(
        f"import sys\nfor name in {tuple(modules)!r}:\n    sys.modules[name] = None\n")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))


def unreachable_repository(tmp_path, monkeypatch) -> None:
    """git sends every github.com URL to a folder that does not exist, and pip only resolves
    (--dry-run), so nothing is installed even if it could be."""
    gitconfig = tmp_path / "gitconfig"
    gitconfig.write_text('[url "file:///nonexistent/"]\n\tinsteadOf = https://github.com/\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(gitconfig))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("PIP_DRY_RUN", "1")
