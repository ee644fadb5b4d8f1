"""Put the JavaScript the offline web book needs (MathJax 3) where the Sphinx build copies it.

    python scripts/offline_assets.py        # idempotent: does nothing when the pinned copy is there

The built book fetches nothing from any host: MathJax is served from the book's own `_static/`.
It is installed here, at set-up time, from a package registry and never committed:

1. npm: `npm pack mathjax@<version>` (the tarball is checked against a pinned SHA-256);
2. else PyPI: the wheel django-static-mathjax==<version>.1, which ships the same MathJax build
   (downloaded with pip, not installed; also checked against its pinned SHA-256).

Only the parts a page can load are kept: the startup loader and the components the book's
MathJax configuration loads (_config.yml: TeX input with its base package and the AMS extension,
CHTML output, assistive MathML; not the 420 kB context menu, nor the 180 kB `input/tex` with
packages the book does not use), the fonts, the TeX extensions, and the full TeX input, the
combined tex-chtml component and the other accessibility and menu modules for anyone who
configures them back.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: html_static_path entry added by scripts/book_web.py: its `mathjax/` lands in `_static/mathjax/`.
VENDOR = ROOT / "_build" / "vendor"
MATHJAX_DIR = VENDOR / "mathjax"
MATHJAX_VERSION = "3.2.2"
NPM_SHA256 = "1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09"
PYPI_WHEEL = f"django-static-mathjax=={MATHJAX_VERSION}.1"
PYPI_SHA256 = "05ad109fd9e5d9d380c76389689b7f523e9ccb7f7a85c1eb962c7564eac7601d"
#: Paths inside MathJax's es5/ folder that the book serves.
KEEP = ("startup.js", "core.js", "input/tex-base.js", "input/tex/extensions/ams.js",
        "output/chtml.js", "output/chtml/fonts/tex.js", "input/tex.js", "tex-chtml.js", "a11y/",
        "ui/", "input/tex/extensions/", "output/chtml/fonts/woff-v2/", "sre/")
STAMP = MATHJAX_DIR / ".installed"
ENTRY = MATHJAX_DIR / "startup.js"
#: Files the book's pages load (a copy made before they were kept is installed again).
REQUIRED = [MATHJAX_DIR / k for k in KEEP if not k.endswith("/")]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wanted(rel: str) -> bool:
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in KEEP)


def _copy_members(names, read, es5_prefix: str, dest: Path) -> int:
    count = 0
    for name in names:
        if not name.startswith(es5_prefix) or name.endswith("/"):
            continue
        rel = name[len(es5_prefix):]
        if ".." in Path(rel).parts or not _wanted(rel):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(read(name))
        count += 1
    return count


def _from_npm(tmp: Path, dest: Path) -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm not found")
    subprocess.run([npm, "pack", f"mathjax@{MATHJAX_VERSION}", "--pack-destination", str(tmp),
                    "--silent"], check=True, cwd=tmp, stdout=subprocess.DEVNULL)
    tgz = tmp / f"mathjax-{MATHJAX_VERSION}.tgz"
    if _sha256(tgz) != NPM_SHA256:
        raise RuntimeError(f"{tgz.name}: SHA-256 {_sha256(tgz)} is not the pinned {NPM_SHA256}")
    with tarfile.open(tgz) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        n = _copy_members(members, lambda n: tar.extractfile(members[n]).read(), "package/es5/",
                          dest)
    return f"npm mathjax@{MATHJAX_VERSION} ({n} files)"


def _from_pypi(tmp: Path, dest: Path) -> str:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                    "--disable-pip-version-check", "--only-binary=:all:", "-d", str(tmp),
                    PYPI_WHEEL], check=True)
    (whl,) = tmp.glob("*.whl")
    if _sha256(whl) != PYPI_SHA256:
        raise RuntimeError(f"{whl.name}: SHA-256 {_sha256(whl)} is not the pinned {PYPI_SHA256}")
    with zipfile.ZipFile(whl) as z:
        n = _copy_members(z.namelist(), z.read, "mathjax/static/mathjax/es5/", dest)
    return f"PyPI {PYPI_WHEEL} ({n} files)"


def installed() -> bool:
    return (all(f.is_file() for f in REQUIRED) and STAMP.is_file()
            and STAMP.read_text().startswith(MATHJAX_VERSION))


def ensure_mathjax(quiet: bool = False) -> Path:
    """Install the pinned MathJax into _build/vendor/mathjax unless it is there; return its path."""
    if installed():
        if not quiet:
            print(f"MathJax {MATHJAX_VERSION} already in {MATHJAX_DIR.relative_to(ROOT)}")
        return MATHJAX_DIR
    errors = []
    for source in (_from_npm, _from_pypi):
        with tempfile.TemporaryDirectory() as tmp:
            staging = Path(tmp) / "mathjax"
            try:
                how = source(Path(tmp), staging)
            except (OSError, RuntimeError, subprocess.CalledProcessError, ValueError) as err:
                errors.append(f"{source.__name__[6:]}: {err}")
                continue
            missing = [k for k in KEEP if not k.endswith("/") and not (staging / k).is_file()]
            if missing:
                errors.append(f"{how}: missing {missing}")
                continue
            shutil.rmtree(MATHJAX_DIR, ignore_errors=True)
            MATHJAX_DIR.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(staging, MATHJAX_DIR)
            STAMP.write_text(f"{MATHJAX_VERSION} from {how}\n")
            print(f"MathJax installed from {how} into {MATHJAX_DIR.relative_to(ROOT)}")
            return MATHJAX_DIR
    raise SystemExit("could not install MathJax for the offline book:\n  " + "\n  ".join(errors))


if __name__ == "__main__":
    ensure_mathjax()
