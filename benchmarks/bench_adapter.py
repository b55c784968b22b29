"""Step time, peak memory, trainable parameters, optimiser state and file size of the grounded adapter.

Compares, on SmolLM2-135M (local GGUF, cached as safetensors), batch 16 x 64 tokens, 512 new tokens:

  (a) grounded  -- this adapter (GroundedTokenConfig)
  (b) trainable -- PEFT's TrainableTokensConfig on the same tokens
  (c) full      -- the whole (tied) embedding matrix trainable
  (d) floor     -- the same forward + backward with no parameter gradients (grad w.r.t. inputs_embeds only)

Each configuration runs in a fresh process (so peak memory is its own); a step is forward + backward
(+ AdamW step for a-c). Prints a markdown table; ``--json`` writes the rows too.

    python benchmarks/bench_adapter.py                 # fp32 and bf16 autocast, 3 rounds x 4 steps
    python benchmarks/bench_adapter.py --rounds 1 --steps 3 --precisions fp32
    python benchmarks/bench_adapter.py --device cuda --rounds 1 --steps 20 --warmup 3   # a GPU

On CUDA the step is timed between ``torch.cuda.synchronize()`` calls and the memory columns are the
CUDA allocator's peak (``max_memory_allocated``) instead of the process's RSS.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    from benchmarks._args import parse
except ModuleNotFoundError:  # run as a file: its folder is on sys.path, not the repository
    from _args import parse

METHODS = ("grounded", "trainable", "full", "floor")


class PeakRSS:
    """Samples the process's resident set size in a thread and keeps the maximum."""

    def __init__(self, interval: float = 0.002) -> None:
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval)

    def __enter__(self):
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_one(
    method: str,
    precision: str,
    steps: int,
    warmup: int,
    new_tokens: int,
    device: str = "cpu",
    batch_size: int = 16,
    seq_len: int = 64,
) -> dict:
    import torch
    from peft import TrainableTokensConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import peft_grounded
    from peft_grounded import assets

    torch.manual_seed(0)
    path = assets.smollm2()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    new = peft_grounded.add_sid_tokens(tokenizer, model, [new_tokens // 2, new_tokens // 2])
    vocab = model.get_input_embeddings().weight.shape[0]
    if method == "grounded":
        model = get_peft_model(model, peft_grounded.GroundedTokenConfig(token_indices=new, init="mean"))
    elif method == "trainable":
        model = get_peft_model(model, TrainableTokensConfig(token_indices=list(new)))
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        if method == "full":
            model.get_input_embeddings().weight.requires_grad_(True)
    model.to(dev)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4) if params else None
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 49152, (batch_size, seq_len), generator=generator)
    mask = torch.rand(batch_size, seq_len, generator=generator) < 0.25
    ids[mask] = torch.as_tensor(new)[torch.randint(0, len(new), (int(mask.sum()),), generator=generator)]
    ids = ids.to(dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    def step() -> None:
        with autocast:
            if method == "floor":
                embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
                loss = model(inputs_embeds=embeds, labels=ids).loss
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    sync()
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        gpu_start = torch.cuda.memory_allocated(dev)
    with PeakRSS() as memory:
        baseline = memory.peak
        for _ in range(steps):
            start = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - start)
    gpu_peak = torch.cuda.max_memory_allocated(dev) if cuda else None
    state_bytes = sum(
        t.numel() * t.element_size()
        for s in (optimizer.state.values() if optimizer else [])
        for t in s.values()
        if torch.is_tensor(t)
    )
    file_bytes = None
    with tempfile.TemporaryDirectory() as out:
        if method in ("grounded", "trainable"):
            model.save_pretrained(out)  # save_embedding_layers="auto", as Trainer and push_to_hub
            file_bytes = os.path.getsize(Path(out) / "adapter_model.safetensors")
        elif method == "full":
            file_bytes = vocab * model.config.hidden_size * 4
    return {
        "method": method,
        "precision": precision,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "batch": [batch_size, seq_len],
        "peak_gpu_mib": None if gpu_peak is None else gpu_peak / 2**20,
        "gpu_over_start_mib": None if gpu_peak is None else (gpu_peak - gpu_start) / 2**20,
        "step_s": statistics.median(times),
        "step_s_all": times,
        "peak_rss_mib": memory.peak / 2**20,
        "peak_over_start_mib": (memory.peak - baseline) / 2**20,
        "trainable_params": sum(p.numel() for p in params),
        "optimizer_state_mib": state_bytes / 2**20,
        "file_mib": None if file_bytes is None else file_bytes / 2**20,
        "ideal_file_mib": new_tokens * model.config.hidden_size * 4 / 2**20,
    }


def table(rows: list[dict]) -> str:
    floor = {r["precision"]: r["step_s"] for r in rows if r["method"] == "floor"}
    tt = {r["precision"]: r["step_s"] for r in rows if r["method"] == "trainable"}
    gpu = bool(rows) and rows[0].get("peak_gpu_mib") is not None
    peak, over = ("peak_gpu_mib", "gpu_over_start_mib") if gpu else ("peak_rss_mib", "peak_over_start_mib")
    memory = "peak GPU allocated" if gpu else "peak RSS"
    lines = [
        f"| precision | method | step ({'ms' if gpu else 's'}, median) | vs TrainableTokens | vs floor | {memory} (MiB) "
        "| peak over start (MiB) | trainable params | optimiser state (MiB) | adapter file (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["precision"]
        file = "-" if r["file_mib"] is None else f"{r['file_mib']:.3f}"
        step = f"{1000 * r['step_s']:.1f}" if gpu else f"{r['step_s']:.2f}"
        ratio_tt = f"{r['step_s'] / tt[p]:.2f}x" if p in tt else "-"
        ratio_floor = f"{r['step_s'] / floor[p]:.2f}x" if p in floor else "-"
        lines.append(
            f"| {p} | {r['method']} | {step} | {ratio_tt} | {ratio_floor} "
            f"| {r[peak]:.0f} | {r[over]:.0f} | {r['trainable_params']:,} "
            f"| {r['optimizer_state_mib']:.2f} | {file} |"
        )
    return "\n".join(lines)


@dataclass
class Settings:
    steps: int = field(default=4, metadata={"help": "timed steps per process"})
    rounds: int = field(
        default=3,
        metadata={
            "help": "processes per configuration, interleaved across methods so drift in the machine's load "
            "hits all of them alike; the median is over every timed step"
        },
    )
    warmup: int = field(default=2, metadata={"help": "untimed steps first"})
    new_tokens: int = field(default=512, metadata={"help": "new tokens added"})
    precisions: list[str] = field(
        default_factory=lambda: ["fp32", "bf16"], metadata={"help": "precisions", "choices": ["fp32", "bf16"]}
    )
    methods: list[str] = field(
        default_factory=lambda: list(METHODS), metadata={"help": "configurations", "choices": METHODS}
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu or cuda[:N] (None: cuda when available, else cpu)"}
    )
    batch_size: int = field(default=16, metadata={"help": "rows per step"})
    seq_len: int = field(default=64, metadata={"help": "tokens per row"})
    json: Path | None = field(default=None, metadata={"help": "write the rows here too"})


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--one"]:  # one configuration (run_one's keywords as JSON) in a fresh process: no parser
        print(json.dumps(run_one(**json.loads(argv[1]))))  # imported, so the peak memory is the method's own
        return
    args = parse(Settings, argv, prog="bench_adapter.py", description=__doc__)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for precision in args.precisions:
        runs: dict[str, list[dict]] = {m: [] for m in args.methods}
        for _ in range(args.rounds):
            for method in args.methods:
                one = dict(method=method, precision=precision, steps=args.steps, warmup=args.warmup)
                one |= dict(new_tokens=args.new_tokens, device=args.device, batch_size=args.batch_size)
                out = subprocess.run(
                    [sys.executable, __file__, "--one", json.dumps(one | {"seq_len": args.seq_len})],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for method in args.methods:
            merged = dict(runs[method][-1])
            merged["step_s_all"] = [t for r in runs[method] for t in r["step_s_all"]]
            merged["step_s"] = statistics.median(merged["step_s_all"])
            merged["peak_rss_mib"] = max(r["peak_rss_mib"] for r in runs[method])
            merged["peak_over_start_mib"] = max(r["peak_over_start_mib"] for r in runs[method])
            rows.append(merged)
            print(f"{precision} {method}: {merged['step_s']:.2f} s/step", file=sys.stderr)
    print(f"load average during the run: {os.getloadavg()}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
