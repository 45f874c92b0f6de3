"""Run `torchdoctor run` on healthy real training scripts and count the symptoms it raises.

For each entry of healthy.jsonl: extract the script's files at the pinned commit from the local
mirror (the `fetch` tool's /work/.mirror/OWNER+NAME/repo) into /tmp/realcode-run/<id>/src, run our
setup snippet there (synthetic data, a tiny local model), then run the script twice from fresh
copies of that folder:

- plain:  python plain_steps.py SCRIPT ARGS   (torchrun for a distributed entry), stopped after
          the same number of optimizer steps as the probed run;
- probed: torchdoctor run --out DIR --format json TORCHDOCTOR_ARGS SCRIPT -- ARGS.

It compares the script's own output (timings, pids and paths normalised) and collects every
symptom, then judges warning-or-worse symptoms against judged.jsonl.

    python bench/realcode/run/eval_run.py [--split dev|heldout] [--only ID[,ID]] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIRRORS = Path("/work/.mirror")
CACHE = Path(os.environ.get("REALCODE_RUN_CACHE", "/tmp/realcode-run"))
SEVERE = ("warning", "error", "critical")


def load_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def venv_bin(name: str) -> str:
    """The tool next to this interpreter (the worktree's venv), else on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def mirror_of(repo: str) -> Path:
    return MIRRORS / repo.replace("/", "+") / "repo"


def prepare(entry: dict) -> Path:
    """Extract the files and run the setup once; the result is reused until the commit changes."""
    root = CACHE / entry["id"]
    src = root / "src"
    stamp = root / "prepared.json"
    want = {"commit": entry.get("commit"), "files": entry["files"], "setup": entry.get("setup_file")}
    setup_file = HERE / "setup" / f"{entry['id']}.py"
    if setup_file.exists():
        want["setup_mtime"] = setup_file.stat().st_mtime
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return src
    shutil.rmtree(root, ignore_errors=True)
    src.mkdir(parents=True)
    if entry.get("repo") and entry["repo"] != "ours":
        git_dir = mirror_of(entry["repo"])
        if not git_dir.exists():
            raise RuntimeError(f"no mirror {git_dir}: fetch github:{entry['repo']} first")
        archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", entry["commit"], *entry["files"]],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    else:  # our own driver, kept in setup/
        for name in entry["files"]:
            shutil.copy(HERE / "setup" / name, src / name)
    if setup_file.exists():
        done = subprocess.run([sys.executable, str(setup_file)], cwd=src, capture_output=True, text=True,
                              timeout=300)
        if done.returncode:
            raise RuntimeError(f"setup failed: {done.stderr.strip().splitlines()[-1:]}")
    stamp.write_text(json.dumps(want))
    return src


def option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def fresh_copy(src: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, symlinks=True)
    return dest


def script_env(entry: dict) -> dict:
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONWARNINGS="default", TQDM_DISABLE="1")
    env.pop("TORCHDOCTOR_DEBUG", None)
    env.update(entry.get("env", {}))
    return env


def run_plain(entry: dict, workdir: Path, timeout: float) -> dict:
    steps = option(entry["torchdoctor_args"], "--steps") or "0"
    nproc = option(entry["torchdoctor_args"], "--nproc-per-node")
    env = script_env(entry)
    env["REALCODE_STEPS"] = steps
    launcher = [sys.executable]
    if nproc:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", nproc]
    cmd = [*launcher, str(HERE / "plain_steps.py"), entry["path"], *entry["args"]]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", timeout=timeout, start_new_session=True)
        code, out = done.returncode, done.stdout
    except subprocess.TimeoutExpired as exc:
        code, out = "timeout", (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    return {"exit": code, "output": out, "seconds": round(time.monotonic() - t0, 1)}


def run_probed(entry: dict, workdir: Path, outdir: Path, timeout: float) -> dict:
    shutil.rmtree(outdir, ignore_errors=True)
    cmd = [venv_bin("torchdoctor"), "run", "--out", str(outdir), "--format", "json", "--fail-on", "never",
           "--timeout", str(int(timeout)), *entry["torchdoctor_args"], entry["path"], "--", *entry["args"]]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=workdir, env=script_env(entry), capture_output=True, text=True, errors="replace",
                              timeout=timeout + 60, start_new_session=True)
        code, report_text, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        code, report_text, err = "timeout", "", ""
    try:
        report = json.loads(report_text)
    except ValueError:
        report_file = outdir / "report.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
    # in json mode the script's stdout and stderr both come on stderr, with torchdoctor's own lines
    own = re.compile(r"^(torchdoctor[: ]|\[torchdoctor\])")
    output = "\n".join(line for line in err.splitlines() if not own.match(line))
    return {"exit": code, "report": report, "output": output, "seconds": round(time.monotonic() - t0, 1)}


TIMING = [
    (re.compile(r"\d+(\.\d+)?\s*(ms|µs|us|s|sec|seconds|it/s|s/it|steps/s|samples/s|MiB|GiB|MB|GB)\b"), "<T>"),
    (re.compile(r"(time|elapsed|runtime|throughput|mfu|samples_per_second|steps_per_second|"
                r"train_runtime|per_second|ms/batch|lr)\W+[-\d.e+%]+", re.I), r"\1 <T>"),
    (re.compile(r"\b\d+:\d\d:\d\d(\.\d+)?"), "<T>"),  # progress bars' elapsed and remaining time
    (re.compile(r"0x[0-9a-f]+"), "<ADDR>"),
    (re.compile(r"\bpid[ =:]*\d+|\[\d{3,}\]", re.I), "<PID>"),
    (re.compile(r"version_\d+"), "version_<N>"),
    # the copies' folders, wherever REALCODE_RUN_CACHE put them (a private cache must not read as changed output)
    (re.compile(re.escape(str(CACHE)) + r"/[^/\s]+/(plain|probed)"), "<DIR>"),
    (re.compile(r"\d{4}-\d\d-\d\d[ T_]\d\d[:\-]\d\d[:\-]\d\d(\.\d+)?"), "<DATE>"),
]
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?", re.I)  # an unseeded script: every number may differ
NOISE = re.compile(r"━|%\||\r|it/s\]|s/it\]|^\s*$|Warning: .*(MASTER_ADDR|OMP_NUM_THREADS)|^\*{10,}|"
                   r"Setting OMP_NUM_THREADS|^W\d{4} |^I\d{4} |torch.distributed.elastic|to skip this")


def normalise(text: str, deterministic: bool, distributed: bool) -> list[str]:
    lines = []
    for line in text.replace("\r", "\n").splitlines():
        if NOISE.search(line):
            continue
        for pattern, repl in TIMING:
            line = pattern.sub(repl, line)
        if not deterministic:
            line = NUMBER.sub("<F>", line)
        lines.append(" ".join(line.split()))  # tables re-pad columns to the numbers' width
    return sorted(lines) if distributed else lines


def compare(plain: str, probed: str, entry: dict) -> dict:
    det = entry.get("deterministic", True)
    dist = entry["framework"] == "ddp" or "--nproc-per-node" in entry["torchdoctor_args"]
    a, b = normalise(plain, det, dist), normalise(probed, det, dist)
    if a == b:
        return {"same": True}
    if dist and Counter("".join(a).replace(" ", "")) == Counter("".join(b).replace(" ", "")):
        # the ranks share one pipe: two prints can land on one line in one run and on two in the other
        return {"same": True, "note": "same characters, ranks' lines interleaved differently"}
    only_plain = [x for x in a if x not in b][:3]
    only_probed = [x for x in b if x not in a][:3]
    return {"same": False, "plain_lines": len(a), "probed_lines": len(b), "only_plain": only_plain,
            "only_probed": only_probed}


def symptom_rows(report: dict, entry: dict) -> list[dict]:
    rows = []
    for s in report.get("symptoms", []):
        loc = s.get("location") or {}
        ev = (s.get("evidence") or [{}])[0]
        if not loc and ev.get("location"):
            loc = ev["location"]
        if isinstance(loc, str):
            path, _, line = loc.rpartition(":")
            loc = {"path": path, "line": int(line) if line.isdigit() else None}
        row = {"symptom": s.get("id"), "severity": s.get("severity"), "path": loc.get("path"),
               "line": loc.get("line"), "summary": (ev.get("summary") or s.get("title") or "")[:200]}
        same = next((r for r in rows if all(r[k] == row[k] for k in ("symptom", "severity", "path", "line"))), None)
        if same:  # each rank of a distributed run reports its own copy (its own numbers): count it once
            same["copies"] += 1
            continue
        rows.append({**row, "copies": 1})
    return rows


def judge(rows: list[dict], entry_id: str, labels: list[dict]) -> None:
    for r in rows:
        r["verdict"] = None
        for lab in labels:
            # "line": "any" for a symptom whose line is where the run happened to be (a hang's stuck line)
            if lab["id"] == entry_id and lab["symptom"] == r["symptom"] and lab.get("line") in (r["line"], "any"):
                r["verdict"] = lab["verdict"]
                break


def evaluate(entry: dict, labels: list[dict], keep: bool) -> dict:
    timeout = float(entry.get("timeout", 180))
    result = {"id": entry["id"], "split": entry["split"], "framework": entry["framework"]}
    try:
        src = prepare(entry)
    except Exception as exc:  # a missing mirror or a failing setup is this entry's result, not the bench's end
        result["error"] = str(exc)
        return result
    root = src.parent
    plain = run_plain(entry, fresh_copy(src, root / "plain"), timeout)
    probed = run_probed(entry, fresh_copy(src, root / "probed"), root / "td-out", timeout)
    rows = symptom_rows(probed["report"], entry)
    judge(rows, entry["id"], labels)
    run = probed["report"].get("run", {})
    result.update(plain_exit=plain["exit"], probed_exit=probed["exit"], stopped=run.get("stopped"),
                  steps=run.get("steps_completed"), plain_s=plain["seconds"], probed_s=probed["seconds"],
                  output=compare(plain["output"], probed["output"], entry), symptoms=rows)
    (root / "plain.out").write_text(plain["output"])
    (root / "probed.out").write_text(probed["output"])
    if not keep:
        shutil.rmtree(root / "plain", ignore_errors=True)
        shutil.rmtree(root / "probed", ignore_errors=True)
    return result


def table(results: list[dict]) -> str:
    out = []
    totals: dict[str, dict[str, int]] = {}
    for r in results:
        split = totals.setdefault(r["split"], {"true": 0, "false": 0, "debatable": 0, "unjudged": 0,
                                                "info": 0, "scripts": 0, "output_changed": 0})
        split["scripts"] += 1
        if "error" in r:
            out.append(f"{r['id']:<22} ERROR {r['error']}")
            continue
        same = "same" if r["output"]["same"] else "CHANGED"
        split["output_changed"] += not r["output"]["same"]
        out.append(f"{r['id']:<22} {r['split']:<7} {r['framework']:<10} plain={r['plain_exit']} "
                   f"probed={r['probed_exit']} stopped={r['stopped']} steps={r['steps']} output={same} "
                   f"({r['plain_s']}s / {r['probed_s']}s)")
        if not r["output"]["same"]:
            out.append(f"    output: plain-only {r['output']['only_plain']} probed-only {r['output']['only_probed']}")
        for s in r["symptoms"]:
            if s["severity"] not in SEVERE:
                split["info"] += 1
                continue
            verdict = s["verdict"] or "unjudged"
            split[verdict] += 1
            where = f"{Path(s['path']).name}:{s['line']}" if s["path"] else "-"
            copies = f" (x{s['copies']} ranks)" if s["copies"] > 1 else ""
            out.append(f"    {s['severity']:<8} {s['symptom']:<24} {where:<22} [{verdict}]{copies} {s['summary'][:110]}")
    out.append("")
    out.append("totals (warning or worse):")
    for split, t in sorted(totals.items()):
        out.append(f"  {split:<8} scripts={t['scripts']} false={t['false']} true={t['true']} "
                   f"debatable={t['debatable']} unjudged={t['unjudged']} (info={t['info']}) "
                   f"output_changed={t['output_changed']}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["dev", "heldout"])
    parser.add_argument("--only", help="comma-separated entry ids")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the plain/probed working copies")
    args = parser.parse_args(argv)
    entries = load_jsonl(HERE / "healthy.jsonl")
    labels = load_jsonl(HERE / "judged.jsonl")
    if args.split:
        entries = [e for e in entries if e["split"] == args.split]
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {e["id"] for e in entries}
        if unknown:
            print(f"eval_run: unknown id(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        entries = [e for e in entries if e["id"] in wanted]
    results = []
    for entry in entries:
        print(f"... {entry['id']}", file=sys.stderr, flush=True)
        results.append(evaluate(entry, labels, args.keep))
    print(json.dumps(results, indent=1) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
