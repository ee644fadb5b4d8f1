"""Launch an engine script once in one process and once under torchrun (two gloo processes).

Both engine test files (TRL, verl) run their script this way: each launch writes its numbers to
the same JSON file, the one-process launch first (the two-process run may compare against it).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# set by a launcher or by verl for its own process; a stale one would misplace the child
_DISTRIBUTED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                    "VERL_PLATFORM", "VERL_ENGINE_DEVICE")


def _run(cmd, script, out, extra_env):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **extra_env,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for k in _DISTRIBUTED_ENV:
        env.pop(k, None)
    p = subprocess.run([*map(str, cmd), script, out], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-8000:]


def one_and_two_processes(script: Path, out: Path, extra_env: dict | None = None) -> dict:
    """Run `script OUT` in one process, then under torchrun in two; return OUT's JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)  # whichever engine script runs first
    out.unlink(missing_ok=True)
    _run([sys.executable], script, out, extra_env or {})
    with socket.socket() as s:  # a free port for the rendezvous (torchrun's 0 can hang)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
          "--master_addr", "127.0.0.1", "--master_port", port], script, out, extra_env or {})
    return json.loads(out.read_text())


def rel(a, b):
    """Relative difference of a from b."""
    return abs(a - b) / max(abs(b), 1e-12)
