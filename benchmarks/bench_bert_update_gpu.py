"""Issue #14's open BERT FP32 question, on one GPU: run_squad.py's training step piece by piece,
each piece beside dlperf's prediction of it.

The BERT SQuAD FP32/TF32 rows of the validation tables split by the GPU's speed: on the fast
GPUs (A100, H100, H200, B200) dlperf predicts them 0.79-0.91x (too slow), on the slower cards
0.96-1.23x (benchmarks/README.md, "The refit ... not shipped"). Their update is
DeepLearningExamples' GradientClipper and BertAdam (``--optimizer-impl bertadam``: ~7,400
launches a step, costed at the unfitted 10 µs of host time each), and either the published
runs issued it faster than that, or part of it overlapped work the model serialises. A trace
of one step would tell; this times the pieces instead, which needs no profiler:

  backward        BERT-large SQuAD (sequence 384), FP32 with TF32 GEMMs, forward and backward
                  as run_squad.py runs them (two cross-entropies over the span logits), the
                  gradients set to None, ``loss.item()`` at the end of every step (the
                  script's ``final_loss``: the CPU waits for the GPU once a step)
  fused           + torch.optim.AdamW(fused=True): the update as dlperf costed it before
  bertadam        + run_squad.py's GradientClipper (one norm over every gradient, then the
                  host reads it) and BertAdam tensor by tensor (torch >= 1.10's clip)
  bertadam-sync   + the same with torch 1.5.1-1.9's clip (a host wait before each tensor)

each beside ``dlperf analyze bert-large --train --dtype fp32 --tf32 --optimizer {none,adamw}
--optimizer-impl ...`` on the preset ``--device``. Derived: each update's span (its step minus
``backward``), measured and predicted, and the host time per launch the BertAdam span implies
over the fused one's (``host_s_per_launch``; dlperf's ``host_s``). The loss is scaled by 1e-4
so that no gradient norm exceeds 1 and the clips never multiply (what the costing assumes;
the arithmetic is unchanged otherwise).

Usage: python benchmarks/bench_bert_update_gpu.py OUT.json [--device h200] [--batch 32]
       [--steps 8] [--warmup 3]
On a machine without a GPU it runs a two-layer BERT on the CPU (a check of the script, not a
measurement: the CPU runs each op as it is issued, and the predictions are the small model's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

CASES = ("backward", "fused", "bertadam", "bertadam-sync")
SEQ = 384  # run_squad.py's --max_seq_length
LOSS_SCALE = 1e-4  # keeps every gradient norm under the clips' 1.0 (see the docstring)


def _bert_config(cuda: bool):
    from dlperf.models.bert import CONFIGS, BertConfig

    # the CPU check: a two-layer BERT at a short sequence, the same code path
    return CONFIGS["bert-large"] if cuda else BertConfig(layers=2, d_model=64, heads=4,
                                                         ffn=128, seq_len=32)


def no_decay(name: str) -> bool:
    """run_squad.py's no_decay list: biases and LayerNorm parameters skip weight decay."""
    return any(key in name for key in ("bias", "norm"))


def gradient_clipper(grads: list, max_norm: float = 1.0) -> None:
    """run_squad.py's GradientClipper: apex's multi_tensor_l2norm over every gradient (here
    torch's _foreach_norm, the same multi-tensor pass), then the host reads the norm and
    scales every gradient when it is above ``max_norm``."""
    import torch

    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    coef = max_norm / (norm + 1e-6)
    if coef.item() < 1:
        torch._foreach_mul_(grads, coef)


def time_case(case: str, batch: int, steps: int, warmup: int) -> list[float]:
    """Seconds per step of ``case`` (CASES), each step ending with ``loss.item()``."""
    import torch
    from torch.nn import functional as F

    from dlperf.models.bert import BertForQuestionAnswering
    from dlperf.provenance import load_sibling

    step_one = load_sibling(__file__, "bench_host_issue_gpu").bertadam_tensor_step
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # run_squad's TF32 rows: NGC's default
    torch.backends.cudnn.allow_tf32 = True
    cfg = _bert_config(cuda)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(cfg).to(device).train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    decays = [0.0 if no_decay(n) else 0.01 for n, _ in named]
    states = [{"m": torch.zeros_like(p), "v": torch.zeros_like(p)} for p in params]
    fused = (torch.optim.AdamW(params, lr=5e-5, weight_decay=0.01, fused=cuda,
                               foreach=not cuda) if case == "fused" else None)
    seq = cfg.seq_len if not cuda else SEQ
    ids = torch.randint(1, cfg.vocab, (batch, seq), device=device)
    starts = torch.randint(0, seq, (batch,), device=device)
    ends = torch.randint(0, seq, (batch,), device=device)
    times = []
    for i in range(warmup + steps):
        begin = time.perf_counter()
        logits = model(ids)
        loss = (F.cross_entropy(logits[:, 0], starts) + F.cross_entropy(logits[:, 1], ends)) / 2
        (loss * LOSS_SCALE).backward()
        if case == "fused":
            fused.step()
        elif case.startswith("bertadam"):
            gradient_clipper([p.grad for p in params])
            for p, state, wd in zip(params, states, decays):
                step_one(p, state, wd, sync_clip=case == "bertadam-sync")
        for p in params:
            p.grad = None
        loss.item()  # run_squad.py's final_loss, every step
        if i >= warmup:
            times.append(time.perf_counter() - begin)
    return times


def predicted(case: str, batch: int, device: str, cuda: bool) -> dict:
    """dlperf's step for ``case``: no update for ``backward``, else AdamW as ``case`` runs."""
    import torch

    import dlperf
    from dlperf.models.bert import BertForQuestionAnswering

    cfg = _bert_config(cuda)
    with torch.device("meta"):
        model = BertForQuestionAnswering(cfg)
    a = dlperf.analyze(model, (batch, cfg.seq_len if not cuda else SEQ), device=device,
                       dtype="fp32", tf32=True, train=True, input_dtype=torch.long,
                       optimizer="none" if case == "backward" else "adamw",
                       optimizer_impl="fused" if case in ("backward", "fused") else case)
    update = [p for p in a.predictions if p.cost.op.endswith("_step")]
    return {"step_s": a.totals()["predicted_time_s"],
            "update_launches": sum(p.cost.kernels for p in update),
            "update_gpu_s": sum(p.time_s for p in update), "host_s": a.host_s}


def run(args) -> dict:
    import torch
    from rich.progress import Progress

    cuda = torch.cuda.is_available()
    rows = []
    with Progress() as progress:
        task = progress.add_task("BERT-large step, piece by piece", total=len(CASES))
        for case in CASES:
            times = time_case(case, args.batch, args.steps, args.warmup)
            if cuda:
                torch.cuda.empty_cache()
            rows.append({"case": case, "median_s": statistics.median(times),
                         "min_s": min(times), "steps": len(times),
                         "predicted": predicted(case, args.batch, args.device, cuda)})
            progress.advance(task)
    by = {r["case"]: r for r in rows}
    base = by["backward"]
    spans = {c: {"measured_s": by[c]["median_s"] - base["median_s"],
                 "predicted_s": by[c]["predicted"]["step_s"] - base["predicted"]["step_s"]}
             for c in CASES[1:]}
    extra = (by["bertadam"]["predicted"]["update_launches"]
             - by["fused"]["predicted"]["update_launches"])
    return {"device": "cuda" if cuda else "cpu", "preset": args.device, "batch": args.batch,
            "rows": rows, "update_spans": spans,
            # BertAdam's extra time over the fused update per extra launch: an upper bound on
            # the host's time per launch (it also holds BertAdam's extra GPU traffic)
            "host_s_per_launch": ((by["bertadam"]["median_s"] - by["fused"]["median_s"]) / extra
                                  if extra else None),
            "predicted_host_s": by["bertadam"]["predicted"]["host_s"],
            "note": None if cuda else "CPU check of the script (a two-layer BERT): not a "
                                      "measurement"}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--device", default="h200", help="dlperf preset for the predictions")
    p.add_argument("--batch", type=int, default=32, help="sequences a step (the DGX A100 "
                   "SQuAD TF32 row's 32)")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        raise SystemExit("--batch and --steps must be at least 1, --warmup at least 0")
    from dlperf.provenance import save_result

    results = run(args)
    save_result(args.out, "bert-update-gpu", vars(args) | {"out": str(args.out)}, results)
    for r in results["rows"]:
        print(f"{r['case']:14s} measured {r['median_s'] * 1e3:8.1f} ms   predicted "
              f"{r['predicted']['step_s'] * 1e3:8.1f} ms")
    for case, s in results["update_spans"].items():
        print(f"  {case:14s} update span: measured {s['measured_s'] * 1e3:7.1f} ms, "
              f"predicted {s['predicted_s'] * 1e3:7.1f} ms")
    print(f"Wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
