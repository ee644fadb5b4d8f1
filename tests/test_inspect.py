"""rlgates.inspect on synthetic captures (rlgates.inspect.synthetic: the capture format with no
trainer): the normaliser detector reads the captured counts, the command's exit status and
one-line errors, the offline report, the gate read from the settings, and the atlas's ranges.
The detectors on real TRL runs with one fault each: tests/engines/test_inspect_engine.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import rlgates
from rlgates.inspect import detectors, inspect_run, synthetic
from rlgates.inspect.capture import SCHEMA_VERSION, load
from rlgates.inspect.cli import main
from rlgates.inspect.stats import method_for, step_numbers, step_rows

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def captures(tmp_path_factory):
    base = tmp_path_factory.mktemp("inspect")
    small = dict(steps=6, rows=16, length=12)
    return {"step": synthetic.write(base / "step", **small),
            "micro": synthetic.write(base / "micro", normaliser="micro-batch", **small),
            "sampled": synthetic.write(base / "sampled", tokens_per_step=40,
                                       normaliser="micro-batch", **small)}


def test_micro_normaliser_is_read_from_the_counts(captures):
    res = {k: inspect_run(p) for k, p in captures.items()}
    # both captures say loss_type "dapo": only the losses and the counts differ
    assert res["step"].run.settings["loss_type"] == res["micro"].run.settings["loss_type"]
    f = {k: {x.name: x for x in r.findings} for k, r in res.items()}
    assert f["micro"]["micro_normaliser"].fired and f["micro"]["micro_normaliser"].checked
    assert not f["step"]["micro_normaliser"].fired and f["step"]["micro_normaliser"].checked
    assert res["step"].fired == [] and res["micro"].fired == ["micro_normaliser"]
    # the fit is exact under the true normaliser and off under the other
    x = res["micro"].numbers
    assert np.nanmax(x["fit_micro"]) < 1e-5 < np.nanmin(x["fit_step"])
    # a sampled step cannot be summed: not checked, and said so
    s = f["sampled"]["micro_normaliser"]
    assert not s.checked and not s.fired and "not checked" in s.message
    for r in res.values():  # no sampler log-probs in these captures
        m = {x.name: x for x in r.findings}["mismatch"]
        assert not m.checked and "no sampler log-probs" in m.message


def test_step_numbers_closed_forms(captures):
    run = load(captures["step"])
    method, agg, note = method_for(run.settings)
    assert (method.name, agg, note) == ("dapo", "token-mean", "")
    rows = step_rows(run, 1)
    delta = 0.3
    rows.logp_sampler = rows.logp_old + delta  # log π_old − log π_sampler = −δ on every token
    x = step_numbers(method, agg, rows)
    assert x["mismatch_kl"] == pytest.approx(np.exp(-delta) - 1 + delta, rel=1e-9)
    assert x["mismatch_absmax"] == pytest.approx(delta, rel=1e-9)
    assert x["rho_is_one"] == 0.0 and step_numbers(method, agg, step_rows(run, 0))[
        "rho_is_one"] == 1.0  # the synthetic first pass of each batch has ρ ≡ 1
    # the atlas numbers are rlgates.diagnostics' own on the same tokens
    ref = rlgates.diagnostics.step_stats(method, rows.logp, rows.logp_old, rows.adv,
                                         rows.mask, entropy=rows.entropy, agg=agg)
    for k in ("clipfrac_pos", "approx_kl", "log_ratio_absmax", "entropy"):
        assert x[k] == pytest.approx(float(ref[k]), rel=1e-12)


@pytest.mark.parametrize("name", ["ppo", "dapo", "gspo", "cispo", "sapo", "dual_clip"])
def test_gate_read_from_the_trainers_flags(name):
    """method_for inverts rlgates.trainers.flags: the same gate on a grid of (ρ, A)."""
    from rlgates.trainers import flags

    m = rlgates.get(name)
    settings = {**flags(m)["trl"], "aggregation": m.agg}
    got, agg, note = method_for(settings)
    assert note == "" and agg == m.agg and got.level == m.level
    ratio = torch.linspace(0.05, 8, 301, dtype=torch.float64)[:, None]
    adv = torch.tensor([-2.0, -0.5, 0.5, 2.0], dtype=torch.float64)[None]
    torch.testing.assert_close(got.gate(ratio, adv), m.gate(ratio, adv), rtol=1e-12, atol=0)
    # negative control: another clip gives another gate
    assert not torch.equal(rlgates.get("ppo", eps=0.1).gate(ratio, adv), m.gate(ratio, adv))


def _conformance_rows():
    from rlgates.trainers import conformance

    return conformance.matrix()


@pytest.mark.parametrize("row", _conformance_rows(),
                         ids=lambda r: f"{r.trainer}-{r.name}-{r.method}")
def test_every_conformance_row_is_read_back_from_its_settings(row):
    """The lookup is the conformance matrix read backwards: a row's settings give the row's
    method at the row's hyperparameters, with nothing assumed."""
    got, agg, note = method_for({"trainer": row.trainer, **row.settings})
    assert (got.name, agg, note) == (row.method, row.agg, "")
    assert got.hparams == pytest.approx(row.hparams, rel=1e-12)


def test_a_setting_without_a_method_says_so():
    """An unknown loss is "no method", never another method's gate (the negative control)."""
    for settings in ({"loss_type": "someday"}, {"trainer": "verl", "loss_mode": "someday"},
                     {"trainer": "verl", "loss_mode": "rlgates_never_registered"},
                     # two of TRL's knobs at once: no one method, and not plain dapo
                     {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28,
                      "off_policy_mask_threshold": 0.5, "top_entropy_quantile": 0.2}):
        method, _, note = method_for(settings)
        assert method is None and "no " in note, settings
    # a capture's verl settings: loss_mode and clip_ratio unprefixed, "inf" as JSON writes it
    verl = {"trainer": "verl", "loss_mode": "vanilla", "clip_ratio": 0.2, "clip_ratio_low": None,
            "clip_ratio_high": 0.28, "clip_ratio_c": "inf", "loss_agg_mode": "token-mean"}
    m, agg, note = method_for(verl)
    assert (m.name, m.hparams, agg, note) == ("dapo", {"eps_low": 0.2, "eps_high": 0.28},
                                              "token-mean", "")
    m, _, _ = method_for({**verl, "clip_ratio_c": 3.0})  # verl's default: its dual clip
    assert (m.name, m.hparams) == ("dapo_dual_clip", {"eps_low": 0.2, "eps_high": 0.28, "c": 3.0})
    m, agg, note = method_for({"trainer": "verl", "loss_mode": "rlgates_vespo"})
    assert m.name == "vespo" and "default" in note
    # TRL's vespo, at a k of its own; a TRL clip aggregated another way is the same gate
    m, agg, _ = method_for({**rlgates.trainers.flags(rlgates.get("vespo", k_pos=1.5))["trl"]})
    assert (m.name, m.hparams["k_pos"], agg) == ("vespo", 1.5, "token-mean")
    m, agg, _ = method_for({"loss_type": "bnpo", "epsilon": 3e-4, "epsilon_high": 4e-4,
                            "importance_sampling_level": "sequence"})
    assert (m.name, agg) == ("gspo", "token-mean")


def test_the_trl_setting_defaults_are_grpoconfigs():
    """conformance_trl.SETTING_DEFAULTS (a knob at its default is off) against TRL itself."""
    trl = pytest.importorskip("trl")
    from rlgates.trainers.conformance_trl import SETTING_DEFAULTS

    fields = trl.GRPOConfig.__dataclass_fields__
    assert {k: fields[k].default for k in SETTING_DEFAULTS} == SETTING_DEFAULTS


def test_a_capture_without_a_method_is_reported_without_a_gate(tmp_path, capsys):
    path = synthetic.write(tmp_path / "cap", steps=2, rows=8, length=6)
    for f in sorted(Path(path).glob("*.npz")):  # the same capture under a loss type we lack
        data = dict(np.load(f, allow_pickle=False))
        data["settings"] = np.asarray(json.dumps({**json.loads(str(data["settings"])),
                                                  "loss_type": "someday"}))
        np.savez(f, **data)
    res = inspect_run(path)
    assert np.isnan(res.numbers["gate_mean"]).all() and np.isfinite(res.numbers["approx_kl"]).all()
    assert main([str(path), "--out", str(tmp_path / "out"), "-q"]) in (0, 1)
    printed = capsys.readouterr().out
    assert "no method: TRL loss_type 'someday'" in printed
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["gate"]["method"] is None


def test_cli_exit_status_report_and_summary(captures, tmp_path, capsys):
    out = tmp_path / "healthy"
    assert main([str(captures["step"]), "--out", str(out), "-q", "--progress", "always"]) == 0
    printed = capsys.readouterr()
    assert printed.out == "" and "6/6 steps" in printed.err  # the bar, on stderr
    assert main([str(captures["step"]), "--out", str(out), "-q", "--no-html"]) == 0
    assert capsys.readouterr().err == ""  # a small capture: no bar
    assert main([str(captures["micro"]), "--out", str(tmp_path / "bad"), "--steps", "1,3"]) == 1
    printed = capsys.readouterr().out
    assert "FINDING micro_normaliser" in printed and "chapter 17, entry 6" in printed
    assert "read: " in printed and "chapter 21, entry 3" in printed
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert summary["status"] == "findings" and summary["fired"] == ["micro_normaliser"]
    assert summary["diagnostics"]["clip_ratio/high_mean"]["trl"] == "clip_ratio/high_mean"
    assert summary["diagnostics"]["ppo_kl"]["verl"] == "actor/ppo_kl"
    assert summary["diagnostics"]["approx_kl"]["healthy"] == [0.0, 0.01]
    assert len(summary["diagnostics"]["entropy"]["per_step"]) == 6
    assert {f["name"] for f in summary["findings"]} == set(detectors.DETECTORS)
    page = (tmp_path / "bad" / "report.html").read_text()
    imgs = re.findall(r"<img [^>]*>", page)
    assert len(imgs) == 3  # the series and the two chosen steps
    for img in imgs:
        assert 'src="data:image/png;base64,' in img and re.search(r'alt="[^"]{40,}"', img)
    # offline: no script, no stylesheet or anything else fetched, no address anywhere
    assert not re.search(r"<script|<link|https?://|src=\"(?!data:)", page)
    assert "tokens of step 3 on the plane" in page and "micro_normaliser" in page


def _one_line(capsys, args, match):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and re.search(match, err), err


def test_cli_refuses_unreadable_input_in_one_line(captures, tmp_path, capsys):
    src = sorted(Path(captures["step"]).glob("step_*.npz"))[0]
    bad = tmp_path / "cut"
    bad.mkdir()
    (bad / src.name).write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    _one_line(capsys, [str(bad)], "corrupt")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.ones(3))
    _one_line(capsys, [str(foreign)], "not an rlgates capture")
    newer = tmp_path / "newer"
    newer.mkdir()
    data = dict(np.load(src, allow_pickle=False))
    np.savez(newer / src.name, **dict(data, schema_version=np.asarray(SCHEMA_VERSION + 1)))
    _one_line(capsys, [str(newer)], "newer than this rlgates reads")
    _one_line(capsys, [str(tmp_path / "missing")], "no such file")
    # a folder of captures names them (the capture fixture's folder holds three)
    _one_line(capsys, [str(Path(captures["step"]).parent)],
              r"no capture files .*; it holds captures in micro, sampled, step$")
    # a capture file whose arrays are missing: one line too, not a traceback
    hollow = tmp_path / "hollow"
    hollow.mkdir()
    np.savez(hollow / src.name, **{k: v for k, v in data.items() if not k.startswith("token/")})
    _one_line(capsys, [str(hollow)], "cannot inspect")
    _one_line(capsys, [str(captures["step"]), "--steps", "a,b"], "comma-separated integers")
    _one_line(capsys, [str(captures["step"]), "--steps", "99"], r"not in the capture")


def test_module_entry_points(capsys):
    """python -m rlgates inspect --help (one process: the rest runs main() in this one)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "rlgates", "inspect", "--help"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Exit status: 0 no finding, 1" in " ".join(out.stdout.split())
    # a reader that stops reading (`| head`): a quiet end with SIGPIPE's shell status, no
    # traceback (negative control: the same output read to the end gives 0 above)
    read, write = os.pipe()
    os.close(read)
    cut = subprocess.run([sys.executable, "-m", "rlgates", "inspect", "--help"], env=env,
                         stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert (cut.returncode, cut.stderr) == (141, ""), cut.stderr
    from rlgates.__main__ import main as top

    assert top(["nonsense"]) == 2 and "unknown command" in capsys.readouterr().err
    assert top([]) == 2  # no command: the usage, on stderr
    printed = capsys.readouterr()
    assert printed.out == "" and "usage: python -m rlgates COMMAND" in printed.err
    assert top(["--help"]) == 0  # asked for: on stdout
    printed = capsys.readouterr()
    assert printed.err == "" and "usage: python -m rlgates COMMAND" in printed.out


def test_healthy_ranges_are_the_atlas_asserts():
    """HEALTHY is what chapter 17 asserts of its healthy run, bound by bound."""
    text = (ROOT / "chapters/17_diagnostics_atlas.md").read_text()
    for key in ("clipfrac_pos", "clipfrac_neg", "signal_lost"):
        assert f'assert fin["{key}"]["hi"] < {detectors.HEALTHY[key][1]}, fin' in text
    assert f'assert fin["log_ratio_absmax"]["hi"] < {detectors.HEALTHY["log_ratio_absmax"][1]}' \
        in text
    assert f"kl_bound = {detectors.HEALTHY['approx_kl'][1]}" in text
    assert detectors.HEALTHY["ppo_kl"][1] == detectors.HEALTHY["approx_kl"][1]
    assert 'float(run_mean(base, "approx_kl").mean()) < kl_bound' in text


def test_each_finding_names_sections_that_exist():
    """Every section a finding sends the reader to is a heading of that chapter, word for word,
    and every detector with a Troubleshooting entry names it."""
    for name, refs in detectors.READ.items():
        assert name in detectors.DETECTORS and refs
        for chapter, heading in refs:
            text = (ROOT / "chapters" / f"{chapter}.md").read_text()
            assert re.search(rf"^#+ {re.escape(heading)}$", text, re.M), (name, heading)
        assert detectors.ATLAS[name].startswith("chapter ")
    assert set(detectors.READ) == set(detectors.DETECTORS)
    assert detectors.reference("21_troubleshooting", "9. Length bias") == \
        "chapter 21, entry 9: Length bias"
    assert detectors.reference("14_real_trainers", "Background") == "chapter 14, Background"
    # the page names the detector in each entry a detector covers
    page = (ROOT / "chapters/21_troubleshooting.md").read_text()
    for name, refs in detectors.READ.items():
        for chapter, heading in refs:
            if chapter == "21_troubleshooting":
                entry = page.split(f"## {heading}")[1].split("\n## ")[0]
                assert f"`{name}`" in entry, (name, heading)


def test_report_marks_ranges_and_counts_gates_of_live_tokens(tmp_path):
    """A mean outside the atlas's healthy range is marked, a healthy one is not; the plane's
    shut-gate share counts tokens with A ≠ 0 (a token with A = 0 has no signal to shut)."""
    from rlgates.inspect import report

    small = dict(steps=4, rows=16, length=12)
    pages = {}
    for name, sd in (("calm", 0.02), ("wild", 0.5)):
        res = inspect_run(synthetic.write(tmp_path / name, log_ratio_sd=sd, **small))
        pages[name] = report.html(res.run, res.numbers, res.findings, steps=[1])
    assert "(outside)" not in pages["calm"] and 'class="out"' not in pages["calm"]
    assert re.search(r'class="out">[0-9.]+ \(outside\)', pages["wild"])
    run = load(tmp_path / "calm")
    at = run.tokens["step"] == 1
    _, alt = report.plane_figure(run, 1)
    assert "A = 0" not in alt and "of the drawn tokens with A ≠ 0 have a shut gate" in alt
    run.tokens["advantage"][at] = 0.0  # every token of step 1 without signal
    _, alt = report.plane_figure(run, 1)
    assert "no drawn token has A ≠ 0" in alt and f"{int(at.sum())} have A = 0" in alt
