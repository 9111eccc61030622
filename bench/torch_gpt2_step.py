#!/usr/bin/env python3
"""torch_gpt2_step.py — the PyTorch baseline for bench_cu_stage: GPT-2 124M
(L=12, NH=12, C=768, maxT=1024, V=50257 padded to 50304, tied head), random
tokens, bf16 autocast, fused AdamW, one training step = forward + backward
(+ grad-norm clip) + AdamW over B x T tokens (B=32, T=1024 by default).
Prints median ms/step and tokens/s for eager and torch.compile, and writes
CSV. Usage: torch_gpt2_step.py [--batch 32] [--seq 1024] [--steps 10]
[--modes eager,compile] [--csv torch_gpt2_step.csv]"""
import argparse, math, time, sys
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, NH):
        super().__init__()
        s.NH = NH
        s.ln1, s.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.qkv, s.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.NH, C // s.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.fcproj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(s, L=12, NH=12, C=768, maxT=1024, Vp=50304):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(Vp, C), nn.Embedding(maxT, C)
        s.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        s.lnf = nn.LayerNorm(C)
        s.head = nn.Linear(C, Vp, bias=False)
        s.head.weight = s.wte.weight
        for m in s.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(s, idx, tgt):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe(torch.arange(T, device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


def run(mode, B, T, steps):
    torch.manual_seed(0)
    model = GPT2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    idx = torch.randint(0, 50257, (B, T), device="cuda")
    tgt = torch.randint(0, 50257, (B, T), device="cuda")
    times = []
    for it in range(steps + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if it >= 3:
            times.append(dt)
        print(f"  {mode} step {it}: {dt * 1e3:.1f} ms loss {loss.item():.4f}", flush=True)
    times.sort()
    ms = times[len(times) // 2] * 1e3
    return ms, B * T / (ms * 1e-3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--csv", default="torch_gpt2_step.csv")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpt2_step: no CUDA device; skipped")
        return 77
    torch.backends.cuda.matmul.allow_tf32 = True
    rows = []
    for mode in a.modes.split(","):
        ms, tps = run(mode, a.batch, a.seq, a.steps)
        rows.append((mode, ms, tps))
    print(f"\nPyTorch {torch.__version__} GPT-2 124M bf16 autocast, {a.batch} x {a.seq} tokens/step, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'mode':<9} {'ms/step':>10} {'tokens/s':>12}")
    with open(a.csv, "w") as f:
        f.write("mode,batch,seq,ms_step,tokens_s\n")
        for mode, ms, tps in rows:
            print(f"{mode:<9} {ms:>10.1f} {tps:>12.0f}")
            f.write(f"{mode},{a.batch},{a.seq},{ms:.3f},{tps:.0f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
