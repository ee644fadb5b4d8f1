"""rlgates/_book/explorer_data.py and the explorer page's line on the methods it leaves out
(scripts/book_web.py: explorer_note), without a browser: every gate of (ρ, A) alone is offered,
DRO's included, its JavaScript agrees with `DRO.gate` and `DRO.signal` (run by node), and the
line names each method left out and why. tests/browser checks the same in the built page."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rlgates
from rlgates._book.explorer_data import explorer_data, explorer_methods

ROOT = Path(__file__).resolve().parents[1]


def test_every_gate_of_rho_and_a_alone_is_offered():
    offered = explorer_methods()
    assert "dro" in offered
    assert [n for n in rlgates.names() if not rlgates.REGISTRY[n].side_inputs] == offered
    entry = {e["name"]: e for e in explorer_data()["methods"]}["dro"]
    assert entry["js"]["bounds"] == "[]"  # a smooth gate: its dashed line is where it is 1/2
    assert [(p["key"], p["default"], p["range"]) for p in entry["params"]] == \
        [("beta", 1.0, [0.05, 5.0, 0.05])]


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the explorer's JS")
def test_dro_javascript_is_rlgates_dro():
    """The explorer's DRO gate and signal (gate·ρ·A, as explorer.js computes it) equal rlgates'
    to 1e-12, at random (ρ, A) and β in the slider's range, at A = 0, ±1e-300 and a subnormal A."""
    entry = {e["name"]: e for e in explorer_data()["methods"]}["dro"]
    lo, hi, _ = entry["params"][0]["range"]
    rng = random.Random(0)
    cases = []
    for beta in [1.0, lo, hi, *(rng.uniform(lo, hi) for _ in range(5))]:
        ratios = [math.exp(rng.uniform(-4, 4)) for _ in range(60)] + [2.0, 0.5, 2.0, 0.5, 2.0, 1.0]
        advs = [rng.uniform(-1, 1) for _ in range(60)] + [0.0, -0.0, 1e-300, -1e-300, 5e-324, -0.5]
        m = rlgates.get("dro", beta=beta)
        r, a = torch.tensor(ratios, dtype=torch.float64), torch.tensor(advs, dtype=torch.float64)
        cases.append({"p": {"beta": beta}, "r": ratios, "a": advs,
                      "gate": m.gate(r, a).tolist(), "signal": m.signal(r, a).tolist()})
    script = ("const [js, cases] = JSON.parse(process.argv[1]);"
              " const f = new Function('r', 'a', 'p', '\"use strict\"; return (' + js + ');');"
              " let worst = 0;"
              " for (const c of cases) for (let k = 0; k < c.r.length; k++) {"
              "   const g = f(c.r[k], c.a[k], c.p), s = g * c.r[k] * c.a[k];"
              "   worst = Math.max(worst, Math.abs(g - c.gate[k]) / Math.max(1, Math.abs(c.gate[k])),"
              "                    Math.abs(s - c.signal[k]) / Math.max(1, Math.abs(c.signal[k])));"
              " }"
              " console.log(worst);")
    res = subprocess.run(["node", "-e", script, json.dumps([entry["js"]["gate"], cases])],
                         capture_output=True, text=True, timeout=60, check=True)
    assert float(res.stdout) <= 1e-12


def test_the_left_out_line_names_each_method_and_why():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import book_web
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    note = book_web.explorer_note()
    offered = explorer_methods()
    left = [rlgates.REGISTRY[n] for n in rlgates.names() if n not in offered]
    assert note.startswith(f"The explorer offers {len(offered)} of the {len(rlgates.names())} "
                           "methods in rlgates."), note
    assert left and all(m.title in note for m in left), note
    # each is left out because its gate reads more than (ρ, A), and the line says what
    assert all(m.side_inputs for m in left)
    for m in left:
        for field in m.side_inputs:
            assert book_web.SIDE_INPUTS[field] in note, (m.name, field)
    assert "DRO" not in note
