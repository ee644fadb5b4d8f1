"""Start every collected engine file's launches at once (tests/engines/launch.py `start`), so that
the verl runs train while the TRL tests wait for theirs. A file names its launch in `LAUNCH`
(script, JSON file, extra environment); its `runs` fixture waits for that launch."""

from __future__ import annotations

import pytest

from tests.engines import launch


@pytest.fixture(scope="session", autouse=True)
def _engine_launches(request):
    modules = {item.module for item in request.session.items}
    for m in sorted(modules, key=lambda m: m.__name__):
        if hasattr(m, "LAUNCH"):
            launch.start(*m.LAUNCH)
