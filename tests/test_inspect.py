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


def test_micro_normaliser_is_read_from_the_counts(captures, tmp_path):
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
    # P7: a sampled step is read from the sums the capture recorded over every token (schema
    # 2), exactly; without them (schema 1) it cannot be summed: not checked, and said so
    s = f["sampled"]["micro_normaliser"]
    assert s.checked and s.fired and (res["sampled"].numbers["fit_recorded"] == 1).all()
    assert res["sampled"].fired == ["micro_normaliser"]
    assert (res["step"].numbers["fit_recorded"] == 1).all()
    old = synthetic.write(tmp_path / "sampled_v1", tokens_per_step=40,
                          normaliser="micro-batch", schema_version=1, steps=6, rows=16, length=12)
    s = {x.name: x for x in inspect_run(old).findings}["micro_normaliser"]
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


def test_a_recorded_method_is_the_gate():
    """P5: a run whose loss is an rlgates method records it (capture.method_record); inspect
    reads it under exactly that method, hyperparameters and aggregation included, before any
    reading of the trainer's settings."""
    from rlgates.inspect.capture import method_record

    m = rlgates.get("sapo", tau_pos=1.5, tau_neg=2.0)
    verl = {"trainer": "verl", "loss_mode": "rlgates_sapo", "loss_agg_mode": "token-mean",
            "method": json.loads(json.dumps(method_record(m, "seq-mean-token-mean")))}
    got, agg, note = method_for(verl)
    assert (got.name, got.hparams, agg, note) == ("sapo", m.hparams, "seq-mean-token-mean", "")
    # without the record: rlgates_sapo at its defaults, and the note says it
    got, _, note = method_for({k: v for k, v in verl.items() if k != "method"})
    assert got.hparams != m.hparams and "default" in note
    # the drop-in TRL trainer: the method's gate under TRL's normaliser (its aggregation)
    trl = {"loss_type": "dr_grpo", "epsilon": 0.2, "aggregation": "seq-mean-token-sum-norm",
           "method": method_record(rlgates.get("dual_clip", c=2.5))}
    got, agg, note = method_for(trl)
    assert (got.name, got.hparams["c"], agg, note) == ("dual_clip", 2.5,
                                                       "seq-mean-token-sum-norm", "")
    # a method this process does not know: no gate, and why
    got, _, note = method_for({"loss_type": "dapo", "method": {"name": "mine", "hparams": {}}})
    assert got is None and "'mine', which is not registered" in note


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


# --- what the command says it could not check, information, the faults real runs showed ------
def _strip_sums(path):
    """The capture as rlgates wrote it before the per-micro-batch sums (schema 1): a sampled
    step then cannot be summed, as on the reviewer's sampled bnpo run (P7)."""
    for f in sorted(Path(path).glob("step_*.npz")):
        data = dict(np.load(f, allow_pickle=False))
        keep = {k: v for k, v in data.items()
                if not (k.startswith(("micro/", "sequence/")) and k.endswith(
                    ("_sum", "_absmax", "sampler_tokens")))}
        settings = {k: v for k, v in json.loads(str(keep["settings"])).items()
                    if k not in ("run_id", "token_loss_method")}
        keep.update(settings=np.asarray(json.dumps(settings)),
                    schema_version=np.asarray(1, dtype=np.int64))
        np.savez_compressed(f, **keep)
    return path


def test_a_detector_that_could_not_run_is_said_and_strict_exits_3(tmp_path, capsys):
    """P7: a sampled capture whose steps cannot be summed, of a per-micro-batch normaliser: the
    normaliser's detector cannot run. The command says so on its last lines, in the JSON and the
    page's headline; the status is 0 (no finding), 3 under --strict (every detector, or the ones
    named), and --strict with an unknown name is refused in one line."""
    cap = _strip_sums(synthetic.write(tmp_path / "cap", steps=4, rows=16, length=12,
                                      tokens_per_step=40, normaliser="micro-batch"))
    f = {x.name: x for x in inspect_run(cap).findings}
    assert not f["micro_normaliser"].checked and "sampled" in f["micro_normaliser"].reason
    out = tmp_path / "out"
    assert main([str(cap), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "NOT CHECKED micro_normaliser: no step keeps every token" in printed
    assert "NOT CHECKED mismatch: the capture has no sampler log-probs (TRL" in printed
    assert re.search(r"^healthy \(not checked: micro_normaliser, mismatch\): no detector found "
                     r"its fault", printed, re.M), printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "healthy"
    assert set(summary["not_checked"]) == {"micro_normaliser", "mismatch"}
    assert summary["not_checked"]["micro_normaliser"] == f["micro_normaliser"].reason
    head = re.search(r"<strong>(.*?)</strong>", (out / "report.html").read_text()).group(1)
    assert "not checked: micro_normaliser, mismatch" in head
    assert main([str(cap), "--out", str(out), "--no-html", "--strict"]) == 3
    assert main([str(cap), "--out", str(out), "--no-html", "--strict=micro_normaliser"]) == 3
    assert main([str(cap), "--out", str(out), "--no-html", "--strict=length_drift"]) == 0
    # -q prints nothing on status 0 or 3: the status says it
    assert main([str(cap), "--out", str(out), "--no-html", "-q", "--strict"]) == 3
    capsys.readouterr()
    _one_line(capsys, [str(cap), "--strict=nonsense"], "--strict: no detector nonsense")
    # negative control: every detector runs on a capture that keeps every token and has the
    # sampler's log-probs, and --strict exits 0 on it
    whole = synthetic.write(tmp_path / "whole", steps=4, rows=16, length=12)
    for g in sorted(Path(whole).glob("step_*.npz")):
        data = dict(np.load(g, allow_pickle=False))
        data["token/logp_sampler"] = data["token/logp_old"]
        np.savez_compressed(g, **data)
    whole = _strip_sums(whole)
    assert main([str(whole), "--out", str(tmp_path / "w"), "--no-html", "--strict"]) == 0, \
        capsys.readouterr().out


def test_rho_one_is_information_not_a_fault(tmp_path, capsys):
    """ρ ≡ 1 (one optimiser step per batch, TRL's default) is said as INFO and exits 0."""
    cap = synthetic.write(tmp_path / "cap", steps=4, rows=16, length=12, log_ratio_sd=0.0)
    res = inspect_run(cap)
    rho = {x.name: x for x in res.findings}["rho_one"]
    assert rho.fired and rho.level == "info" and not rho.fault and rho.verdict == "INFO"
    assert main([str(cap), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "INFO rho_one: ρ = 1 exactly" in printed and "FINDING" not in printed
    assert "information: rho_one" in printed
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert (summary["status"], summary["info"], summary["fired"]) == ("healthy", ["rho_one"],
                                                                     ["rho_one"])
    assert "<td>INFO</td>" in (tmp_path / "o" / "report.html").read_text()


def _first_updates_by_hand(ga, spg, mu, steps):
    """TRL's _prepare_inputs, micro-batch by micro-batch: the weights π_old was computed under
    (the optimiser step at its generation) against those the loss sees."""
    every, gen_at, out = spg * mu, None, []
    for step in range(steps):
        same = True
        for i in range(step * ga, step * ga + ga):
            if i % every == 0:
                gen_at = i // ga  # the optimiser step whose weights computed π_old
            same &= gen_at == step
        out.append(same)
    return out


@pytest.mark.parametrize("ga,spg,mu", [(2, 2, 2), (2, 4, 2), (3, 2, 1), (4, 8, 1), (1, 1, 3),
                                       (2, 6, 1), (4, 2, 3)])
def test_the_updates_where_rho_must_be_one(ga, spg, mu):
    settings = {"gradient_accumulation_steps": ga, "steps_per_generation": spg,
                "num_iterations": mu}
    first, why = detectors._first_updates(settings, np.arange(24))
    assert why == "" and first.tolist() == _first_updates_by_hand(ga, spg, mu, 24)
    assert first[0]  # the first update of a run is always one


def test_no_pi_old_or_verl_is_not_checked():
    x = {"step": np.arange(4), "log_ratio_absmax": np.zeros(4), "approx_kl": np.zeros(4)}
    for settings, says in (
            ({"gradient_accumulation_steps": 2, "steps_per_generation": 2,
              "num_iterations": 1}, "TRL computes no π_old"),  # TRL's default: ρ ≡ 1 anyway
            ({"trainer": "verl", "ppo_epochs": 1}, "verl capture does not record"),
            ({"loss_type": "dapo"}, "lack num_iterations")):
        f = detectors.noisy_forward(x, settings)
        assert not f.checked and says in f.reason, (settings, f.message)
    # vLLM's correction: TRL computes π_old even when the steps align
    f = detectors.noisy_forward(x, {"gradient_accumulation_steps": 2, "steps_per_generation": 2,
                                    "num_iterations": 1, "use_vllm": True,
                                    "vllm_importance_sampling_correction": True})
    assert f.checked and not f.fired


def test_noisy_forward_on_a_capture_with_noise_before_any_update(tmp_path, capsys):
    """log ρ ≠ 0 on the first update of a generation batch (steps 0, 2, ... of the synthetic
    run: GA 2, SPG 2, μ 2) fires noisy_forward, and step_size defers to it; the same capture
    without the noise is quiet (the negative control)."""
    cap = synthetic.write(tmp_path / "cap", steps=6, rows=16, length=12, log_ratio_sd=0.3)
    quiet = {x.name: x for x in inspect_run(cap).findings}
    assert quiet["noisy_forward"].checked and not quiet["noisy_forward"].fired
    assert quiet["step_size"].fired  # σ = 0.3 on the reused steps: too large a step
    rng = np.random.default_rng(0)
    for f in sorted(Path(cap).glob("step_*.npz")):
        data = dict(np.load(f, allow_pickle=False))
        if int(data["step"]) % 2 == 0:
            old = data["token/logp_old"]
            data["token/logp"] = (old + rng.normal(0, 0.3, old.shape)).astype(np.float32)
            np.savez_compressed(f, **data)
    got = {x.name: x for x in inspect_run(cap).findings}
    assert got["noisy_forward"].fired and got["noisy_forward"].evidence["steps_checked"] == 3
    assert "dropout" in got["noisy_forward"].message
    assert re.search(r"at step \d \(TRL's step \d\)", got["noisy_forward"].message)
    assert not got["step_size"].fired and "noisy_forward" in got["step_size"].message
    assert main([str(cap), "--out", str(tmp_path / "o"), "--no-html"]) == 1
    assert "FINDING noisy_forward" in capsys.readouterr().out


def _numbers(n=8, **kw):
    x = {"step": np.arange(n), "frac_reward_zero_std": np.zeros(n), "entropy": np.ones(n),
         "rho_is_one": np.zeros(n), "approx_kl": np.full(n, 1e-3),
         "neg_signal_ratio": np.full(n, 3.0), "neg_signal_max": np.ones(n),
         **{k: np.full(n, 1e-3) for k in detectors.STEP_SIZE_KEYS if k != "approx_kl"}}
    x.update({k: np.asarray(v, dtype=float) for k, v in kw.items()})
    return x


def test_stuck_groups_fires_on_a_run_that_ends_stuck():
    """P14: the last quarter of the steps above the threshold fires, whatever the run's mean;
    a run stuck at the start and moving at the end does not."""
    ends = detectors.stuck_groups(_numbers(frac_reward_zero_std=[0] * 6 + [1, 1]), {})
    assert ends.fired and "ends stuck" in ends.message
    assert ends.evidence["frac_reward_zero_std_mean"] < detectors.STUCK_SHARE
    starts = detectors.stuck_groups(_numbers(frac_reward_zero_std=[1, 1] + [0] * 6), {})
    assert starts.checked and not starts.fired
    # collapsed: the entropy explains the flat groups
    low = detectors.stuck_groups(_numbers(frac_reward_zero_std=[0] * 6 + [1, 1],
                                          entropy=[1.0] * 6 + [0.1, 0.1]), {})
    assert not low.fired and "entropy_collapse" in low.message


def test_negative_blowup_without_a_negative_token_is_not_checked():
    """P21: no A < 0 token with an open gate (or no gate at all): "not checked", never
    "0.0× the median"; one such token 40× the median fires."""
    none = detectors.negative_blowup(_numbers(neg_signal_ratio=np.zeros(8),
                                              neg_signal_max=np.zeros(8)), {})
    assert not none.checked and "A < 0" in none.reason
    gateless = detectors.negative_blowup(_numbers(neg_signal_ratio=np.full(8, np.nan)), {})
    assert not gateless.checked and "no gate" in gateless.reason
    big = detectors.negative_blowup(_numbers(neg_signal_ratio=[3] * 5 + [40, 3, 3]), {})
    assert big.fired and "at step 5 (TRL's step 6)" in big.message


def test_mismatch_names_its_usual_causes():
    """P15: the finding lists the causes to compare and points to entries 6 and 7."""
    x = {"mismatch_kl": np.array([0.1]), "mismatch_absmax": np.array([0.9])}
    f = detectors.mismatch(x, {"temperature": 1.0, "generation_kwargs": {"temperature": 0.5}})
    for cause in ("temperature", "top_p", "position ids", "padding", "dropout", "stale",
                  "precision"):
        assert cause in f.message, cause
    assert "generation_kwargs here sets temperature 0.5 (config 1.0)" in f.message
    assert "entry 6" in f.atlas and "entry 7: Top-p sampling" in f.atlas
    verl = detectors.mismatch({"mismatch_kl": np.array([np.nan])}, {"trainer": "verl"})
    assert not verl.checked and "rollout_log_probs" in verl.reason


def test_generation_kwargs_overrides_are_shown(tmp_path):
    """P16: TRL samples with generation_kwargs' temperature/top_p/top_k, not the config's: the
    report's settings mark it (a capture may hold the dict, or its text)."""
    from rlgates.inspect import report

    for given in ({"temperature": 0.5, "top_k": 0}, "{'temperature': 0.5, 'top_k': 0}",
                  '{"temperature": 0.5, "top_k": 0}'):
        over = detectors.sampling_overrides({"temperature": 1.0, "top_k": 0,
                                             "generation_kwargs": given})
        assert over == {"temperature": (1.0, 0.5)}, given
    assert detectors.sampling_overrides({"temperature": 1.0}) == {}
    assert detectors.sampling_overrides({"generation_kwargs": "not a dict"}) == {}
    res = inspect_run(synthetic.write(tmp_path / "cap", steps=2, rows=8, length=6))
    res.run.settings["generation_kwargs"] = {"temperature": 0.5}
    page = report.html(res.run, res.numbers, res.findings, steps=[1])
    assert "generation_kwargs overrides it: TRL samples with 0.5" in page
    assert res.summary["sampling_overrides"] == {"temperature": [1.0, 0.5]}


def test_headline_counts_the_diagnostics_outside_their_range(tmp_path):
    """P17: "no detector fired" never sits above red rows without saying so; P18: the page
    says how capture steps map to TRL's."""
    from rlgates.inspect import report

    heads = {}
    for name, sd in (("calm", 0.02), ("wild", 0.5)):
        res = inspect_run(synthetic.write(tmp_path / name, steps=4, rows=16, length=12,
                                          log_ratio_sd=sd))
        page = report.html(res.run, res.numbers, res.findings, steps=[1])
        heads[name] = re.search(r"<strong>(.*?)</strong>", page).group(1)
        outside = res.summary["outside"]
        assert page.count("(outside)") == len(outside)
        assert "TRL logs as step k + 1" in page
    assert "outside the atlas" not in heads["calm"]
    assert re.search(r"\d+ diagnostics outside the atlas(&#x27;|')s healthy range \(",
                     heads["wild"])


def test_step_labels():
    assert detectors.step_label(0, {"loss_type": "dapo"}) == "step 0 (TRL's step 1)"
    assert "optimiser step 4" in detectors.step_label(3, {"trainer": "verl"})


def test_gate_zero_is_token_weighted_over_processes():
    """P22: over processes rlgates/gate_zero and gate_mean weigh each process by its tokens
    with A ≠ 0, as TRL weighs its clip fractions: the value equals the one of both processes'
    tokens together, not the mean of the two shares."""
    from rlgates.trainers import gate_stats
    from rlgates.trainers import trl as rtrl

    g = torch.Generator().manual_seed(0)
    T = 6

    def batch(rows, filled):
        old = -torch.rand(rows, T, generator=g, dtype=torch.float64) * 2
        logp = old + torch.randn(rows, T, generator=g, dtype=torch.float64) * 0.4
        adv = torch.randn(rows, generator=g, dtype=torch.float64)
        mask = torch.arange(T)[None] < torch.tensor(filled)[:, None]
        return logp, old, adv, mask

    a, b = batch(2, [6, 5]), batch(4, [2, 6, 3, 1])

    class Recorder:  # process B: its local tensors, in the order the reductions ask for them
        num_processes = 2

        def __init__(self):
            self.seen = []

        def reduce(self, t, reduction="sum"):
            self.seen.append(t.clone())
            return t

        def gather(self, t):
            self.seen.append(t.clone())
            return t

    class Joined:  # process A, joined with B's tensors as two processes would be
        num_processes = 2

        def __init__(self, other):
            self.other = list(other)

        def reduce(self, t, reduction="sum"):
            return t + self.other.pop(0)

        def gather(self, t):
            return torch.cat([t, self.other.pop(0)])

    dapo = rlgates.get("dapo")
    rec = Recorder()
    rtrl.metrics(dapo, *b, accelerator=rec)
    got = rtrl.metrics(dapo, *a, accelerator=Joined(rec.seen))
    both = [torch.cat([x, y]) for x, y in zip(a, b, strict=True)]
    want = gate_stats(dapo, *both)
    for k in ("gate_zero", "gate_mean"):
        assert got[f"rlgates/{k}"] == pytest.approx(want[k], rel=1e-6), k  # float32 shares
    per = [gate_stats(dapo, *x)["gate_zero"] for x in (a, b)]
    assert abs(np.mean(per) - want["gate_zero"]) > 1e-3  # the unweighted mean is another number
    # one process: its own numbers, bit for bit
    assert rtrl.metrics(dapo, *a)["rlgates/gate_zero"] == gate_stats(dapo, *a)["gate_zero"]


def test_readme_states_each_detector_and_the_exit_statuses():
    """The README's table has a row per detector with the thresholds the code uses, and the
    exit statuses the command returns."""
    from rlgates.inspect import cli

    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `(\w+)`", text, re.M)
    assert [r for r in rows if r in detectors.DETECTORS] == list(detectors.DETECTORS)
    assert f"abs(log ρ) > {detectors.NOISE_ABSMAX}" in text
    assert f"KL(sampler ‖ π_old) > {detectors.MISMATCH_KL}" in text
    assert f"over the steps with ρ ≠ 1 > {detectors.STEP_SIZE_KL}" in text
    assert f"≥ {detectors.STUCK_SHARE:.0%}".replace("%", " %") in text
    assert f"> {detectors.BLOWUP_RATIO:g}× the step's median" in text
    assert f"×{detectors.LENGTH_GROWTH}" in text
    assert (cli.EXIT_HEALTHY, cli.EXIT_FINDINGS, cli.EXIT_UNREADABLE,
            cli.EXIT_NOT_CHECKED) == (0, 1, 2, 3)
    for said in ("Exit status: 0 no finding", "1 at least one finding", "2 the input could not",
                 "3 only with\n`--strict`"):
        assert said in text, said
