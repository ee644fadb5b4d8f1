#!/usr/bin/env bash
# The GPU check: every chapter executed on a CUDA machine, then the loss benchmark on cuda and cpu.
#
#     bash benchmarks/gpu_check.sh                      # all chapters, then bench.py --devices cuda cpu
#     bash benchmarks/gpu_check.sh --chapters 04 11     # chapters by number (or file stem)
#     bash benchmarks/gpu_check.sh --allow-cpu --chapters 02 --bench-args "--methods ppo --sizes 32x16"
#
# For a machine lent with a GPU and a copy of this repository, nothing installed but Python (and
# perhaps a CUDA torch). It uses the first Python among --python, $PYTHON, .venv/bin/python and
# python3 whose torch sees CUDA; it keeps that torch. What the chapters need beyond it (numpy,
# matplotlib, ipywidgets, ipykernel, jupytext, nbclient, myst-nb: --full adds all of
# requirements.txt but torch, TRL and verl included, for chapter 14's trainer cells) goes into a
# venv that sees the system's packages (/tmp/rlgates-gpu-venv), at requirements.txt's pins. A
# torch is installed (PyPI's default Linux wheel, built for CUDA) only where none imports.
# rlgates itself is taken from this checkout (PYTHONPATH), not installed.
#
# Without CUDA it stops with one line, unless --allow-cpu (to try the script on a laptop).
#
# Each chapter is the notebook scripts/chapter_sources.py makes of chapters/NN_*.md, executed by
# nbclient in its own kernel (cwd chapters/, as nbval and the book run it), --jobs at a time. Each
# prints its device in its first cell (rlgates.setup: "rlgates: device = cuda ..."); this script
# reports that device, the chapter's wall time and whether every cell ran (a failed assert
# stops a chapter and is reported with its error). The whole run keeps to --budget seconds
# (default 470, under 8 minutes, setup included): chapters still running when the benchmark's
# share (--bench-reserve, default 150 s) is due are stopped and reported as timed out.
#
# Results: under $OUT when set (the device machine's return folder), else bench-results/gpu_check
# (ignored by git): summary.txt (the chapter table), chapters.json, bench.txt, env.txt, and each
# failed chapter's error in errors/NN_*.txt (--keep-notebooks also keeps the executed notebooks).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALLOW_CPU=0 FULL=0 KEEP=0 JOBS="" PY_ARG="" BUDGET=470 BENCH_RESERVE=150
BENCH_ARGS="" CHAPTERS=()
usage() { sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --allow-cpu) ALLOW_CPU=1 ;;
        --full) FULL=1 ;;
        --keep-notebooks) KEEP=1 ;;
        --jobs) JOBS="$2"; shift ;;
        --python) PY_ARG="$2"; shift ;;
        --budget) BUDGET="$2"; shift ;;
        --bench-reserve) BENCH_RESERVE="$2"; shift ;;
        --bench-args) BENCH_ARGS="$2"; shift ;;
        --chapters) shift
            while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do CHAPTERS+=("$1"); shift; done
            continue ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

RESULTS="${OUT:-$ROOT/bench-results/gpu_check}"
mkdir -p "$RESULTS" || { echo "gpu_check: cannot write $RESULTS" >&2; exit 2; }
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
log() { echo "[gpu_check $(( SECONDS ))s] $*"; }
elapsed() { echo $(( SECONDS )); }

# --- a Python whose torch sees CUDA ----------------------------------------------------------------
has_torch() { "$1" -c 'import torch' >/dev/null 2>&1; }
has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
CANDIDATES=()
[ -n "$PY_ARG" ] && CANDIDATES+=("$PY_ARG")
[ -n "${PYTHON:-}" ] && CANDIDATES+=("$PYTHON")
[ -x "$ROOT/.venv/bin/python" ] && CANDIDATES+=("$ROOT/.venv/bin/python")
command -v python3 >/dev/null && CANDIDATES+=("$(command -v python3)")
command -v python >/dev/null && CANDIDATES+=("$(command -v python)")
[ ${#CANDIDATES[@]} -gt 0 ] || { echo "gpu_check: no Python found (python3, or --python PATH)"; exit 2; }
PY="" TORCH_PY=""
for c in "${CANDIDATES[@]}"; do
    if has_cuda "$c"; then PY="$c"; break; fi
    if [ -z "$TORCH_PY" ] && has_torch "$c"; then TORCH_PY="$c"; fi
done
GPU_PRESENT=0
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && GPU_PRESENT=1
VENV=/tmp/rlgates-gpu-venv
make_venv() {  # a venv over the system's packages (an existing torch stays visible)
    [ -x "$VENV/bin/python" ] && return 0
    log "creating $VENV (--system-site-packages) from $1"
    "$1" -m venv --system-site-packages "$VENV" || return 1
    "$VENV/bin/python" -m pip --version >/dev/null 2>&1 \
        || "$VENV/bin/python" -m ensurepip --upgrade >/dev/null 2>&1
}
pin() {  # requirements.txt's line for a package, else the bare name
    local line; line="$(grep -iE "^$1(\[[^]]*\])?==" "$ROOT/requirements.txt" | head -1)"
    echo "${line:-$1}"
}
if [ -z "$PY" ]; then
    if [ "$GPU_PRESENT" = 1 ] || [ -z "$TORCH_PY" ]; then
        # a GPU but no torch that sees it (or no torch at all): install one into the venv
        BASE="${CANDIDATES[0]}"
        if make_venv "$BASE" && { log "installing $(pin torch) (PyPI's CUDA build on Linux)";
                "$VENV/bin/python" -m pip install -q "$(pin torch)"; }; then
            has_cuda "$VENV/bin/python" && PY="$VENV/bin/python"
            [ -z "$TORCH_PY" ] && has_torch "$VENV/bin/python" && TORCH_PY="$VENV/bin/python"
        else
            log "could not install torch (no package registry reachable?)"
        fi
    fi
fi
if [ -z "$PY" ]; then
    if [ "$ALLOW_CPU" != 1 ]; then
        echo "gpu_check: refused: no CUDA here (torch: ${TORCH_PY:-none importable}; GPU seen by nvidia-smi: $([ "$GPU_PRESENT" = 1 ] && echo yes || echo no)); pass --allow-cpu to run on the CPU"
        exit 3
    fi
    [ -n "$TORCH_PY" ] || { echo "gpu_check: no Python with torch, and none could be installed"; exit 2; }
    PY="$TORCH_PY"
    log "no CUDA: running on the CPU (--allow-cpu)"
fi

# --- what the chapters need beyond torch ---------------------------------------------------------
NEEDED=(numpy matplotlib ipywidgets ipykernel jupytext nbclient nbformat myst_nb yaml PIL)
missing() {
    "$1" - "${NEEDED[@]}" <<'EOF'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
EOF
}
MISSING="$(missing "$PY")"
if [ -n "$MISSING" ] || [ "$FULL" = 1 ]; then
    PIP_USER=()
    if [ "$PY" != "$VENV/bin/python" ]; then
        if make_venv "$PY"; then
            PY="$VENV/bin/python"
        else  # no venv module (Debian without python3-venv): the user's site-packages instead
            log "cannot create $VENV; installing with pip --user"
            PIP_USER=(--user)
        fi
    fi
    # requirements.txt's pins as constraints, torch left to what is installed
    grep -vE '^\s*(#|-e|torch==)' "$ROOT/requirements.txt" | grep -v '^\s*$' > "$WORK/constraints.txt"
    if [ "$FULL" = 1 ]; then
        grep -vE '^\s*(#|-e|torch==)' "$ROOT/requirements.txt" | grep -v '^\s*$' > "$WORK/wanted.txt"
    else
        : > "$WORK/wanted.txt"
        for m in $MISSING; do
            case "$m" in
                myst_nb) pkg=jupyter-book ;;   # myst-nb at the version jupyter-book pins
                yaml) pkg=pyyaml ;;
                PIL) pkg=pillow ;;
                nbclient|nbformat) pkg=nbval ;; # brings both, at nbval's pin
                *) pkg="$m" ;;
            esac
            pin "$pkg" >> "$WORK/wanted.txt"
        done
    fi
    log "installing with $PY: $(tr '\n' ' ' < "$WORK/wanted.txt")"
    "$PY" -m pip install -q "${PIP_USER[@]}" -c "$WORK/constraints.txt" -r "$WORK/wanted.txt" \
        || log "pip install failed (offline?); going on with what imports"
    MISSING="$(missing "$PY")"
    [ -z "$MISSING" ] || { echo "gpu_check: still missing: $MISSING"; exit 2; }
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONHASHSEED=0 \
    MPLBACKEND=module://matplotlib_inline.backend_inline
{
    echo "python: $PY"
    "$PY" -c 'import sys, torch, rlgates
print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda,
      "available", torch.cuda.is_available())
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
print("rlgates", rlgates.__file__, "device()", rlgates.device())'
    echo "git: $(git -C "$ROOT" log -1 --format='%h %s' 2>/dev/null | cut -c1-100) $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed file(s)"
    echo "cpus: $(nproc), load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    [ "$GPU_PRESENT" = 1 ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} > "$RESULTS/env.txt" 2>&1
cat "$RESULTS/env.txt"
if ! grep -q "^rlgates " "$RESULTS/env.txt"; then
    echo "gpu_check: rlgates does not import with $PY (see above)"; exit 2
fi
DEVICE_TYPE="$("$PY" -c 'import rlgates; print(rlgates.device().type)')"

# --- the chapters ----------------------------------------------------------------------------------
if [ -z "$JOBS" ]; then
    if [ "$DEVICE_TYPE" = cuda ]; then JOBS=$(( $(nproc) / 4 )); [ "$JOBS" -gt 6 ] && JOBS=6; else JOBS=1; fi
    [ "$JOBS" -ge 1 ] || JOBS=1
fi
DEADLINE=$(( BUDGET - BENCH_RESERVE - $(elapsed) ))
[ "$DEADLINE" -gt 30 ] || DEADLINE=30
cat > "$WORK/chapters.py" <<'EOF'
"""Run chapters, JOBS at a time, each in its own process (and kernel), within a deadline."""
import json, os, re, signal, subprocess, sys, time
from pathlib import Path

root, results, jobs, deadline, keep, *picks = sys.argv[1:]
root, results = Path(root), Path(results)
jobs, deadline, keep = int(jobs), time.monotonic() + float(deadline), keep == "1"
sys.path.insert(0, str(root / "scripts"))

if picks and picks[0] == "--one":  # child: execute one chapter, print one JSON line
    import nbclient, nbformat
    from chapter_sources import read
    src = Path(picks[1])
    nb = read(src)
    start = time.perf_counter()
    status, error = "ok", ""
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(src.parent)}})
    try:
        client.execute()
    except Exception as e:  # a cell raised (an assert failed): the chapter stops there
        status = "failed"
        head = (f"{e.ename}: {e.evalue}" if hasattr(e, "ename")
                else f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        error = re.sub(r"\x1b\[[0-9;]*m", "", f"{head}\n\n{e}")
    seconds = time.perf_counter() - start
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) if o.get("output_type") == "stream")
    found = re.search(r"rlgates: device = (\S+)", text)
    if keep:
        (results / "chapters").mkdir(exist_ok=True)
        nbformat.write(nb, str(results / "chapters" / f"{src.stem}.ipynb"))
    print(json.dumps({"chapter": src.stem, "device": found[1] if found else "?",
                      "seconds": round(seconds, 1), "status": status, "error": error}))
    sys.exit(0)

sources = sorted((root / "chapters").glob("[0-9][0-9]_*.md"))
if picks:
    want = [p.zfill(2) if p.isdigit() else p for p in picks]
    sources = [s for s in sources if any(s.stem == w or s.stem.startswith(w + "_") for w in want)]
    if not sources:
        sys.exit(f"gpu_check: no chapter matches {' '.join(picks)}")
pending, running, done = list(sources), {}, []
while pending or running:
    while pending and len(running) < jobs and time.monotonic() < deadline:
        src = pending.pop(0)
        proc = subprocess.Popen([sys.executable, __file__, str(root), str(results), "1", "0",
                                 "1" if keep else "0", "--one", str(src)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        running[src] = (proc, time.perf_counter())
    if time.monotonic() >= deadline:
        for src in pending:
            done.append({"chapter": src.stem, "device": "-", "seconds": 0, "status": "not run",
                         "error": "budget spent before it started"})
        pending = []
    for src, (proc, t0) in list(running.items()):
        if proc.poll() is None and time.monotonic() < deadline:
            continue
        if proc.poll() is None:  # over the deadline: stop it (its kernel, in a session of its
            # own, exits when it sees its parent gone: ipykernel's parent poller)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            row = {"chapter": src.stem, "device": "?", "seconds": round(time.perf_counter() - t0, 1),
                   "status": "timed out", "error": "stopped at the chapters' deadline"}
        else:
            out, err = proc.communicate()
            lines = [l for l in out.splitlines() if l.startswith("{")]
            row = json.loads(lines[-1]) if lines else {
                "chapter": src.stem, "device": "?", "seconds": round(time.perf_counter() - t0, 1),
                "status": "crashed", "error": err.strip().splitlines()[-1] if err.strip() else ""}
        done.append(row)
        del running[src]
        print(f"  {row['chapter']:<28} {row['device']:<6} {row['seconds']:>7.1f} s  {row['status']}",
              flush=True)
        if row["error"]:
            (results / "errors").mkdir(exist_ok=True)
            (results / "errors" / f"{row['chapter']}.txt").write_text(row["error"] + "\n")
    time.sleep(0.2)
done.sort(key=lambda r: r["chapter"])
(results / "chapters.json").write_text(json.dumps(done, indent=1) + "\n")
lines = [f"{'chapter':<28} {'device':<6} {'seconds':>8}  status"]
lines += [f"{r['chapter']:<28} {r['device']:<6} {r['seconds']:>8.1f}  {r['status']}"
          + (f"  ({r['error'].splitlines()[0][:120]})" if r["error"] else "") for r in done]
ok = sum(r["status"] == "ok" for r in done)
lines.append(f"{ok} of {len(done)} chapters ran every cell; "
             f"devices: {', '.join(sorted({r['device'] for r in done}))}")
(results / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if ok == len(done) else 1)
EOF
log "chapters: ${CHAPTERS[*]:-all}, $JOBS at a time, ${DEADLINE}s for them"
CH_START=$SECONDS
"$PY" "$WORK/chapters.py" "$ROOT" "$RESULTS" "$JOBS" "$DEADLINE" "$KEEP" "${CHAPTERS[@]}"
CH_RC=$?
log "chapters done in $(( SECONDS - CH_START ))s (exit $CH_RC)"

# --- the benchmark ---------------------------------------------------------------------------------
if [ -z "$BENCH_ARGS" ]; then
    if [ "$DEVICE_TYPE" = cuda ]; then BENCH_ARGS="--devices cuda cpu"; else BENCH_ARGS="--devices cpu"; fi
fi
LEFT=$(( BUDGET - $(elapsed) ))
[ "$LEFT" -gt 20 ] || LEFT=20
log "bench.py $BENCH_ARGS (at most ${LEFT}s)"
# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
timeout -k 5 "$LEFT" "$PY" "$ROOT/benchmarks/bench.py" $BENCH_ARGS > "$RESULTS/bench.txt" 2>&1
BENCH_RC=$?
cat "$RESULTS/bench.txt"
[ "$BENCH_RC" = 124 ] && log "bench.py stopped at the budget (the lines above are what it finished)"
log "total $(elapsed)s; chapters exit $CH_RC, bench exit $BENCH_RC; results in $RESULTS"
[ "$CH_RC" = 0 ] && [ "$BENCH_RC" = 0 ]
