#!/usr/bin/env python3
"""PyTorch eager latency on the GPU for the peers of the device check's CUDA timings:
torchvision resnet50 / mobilenet_v2 (weights=None) and a transformers BertModel (BertConfig
defaults, random init, seq 128), fp32, batch 1 and 8. Prints a markdown table (ms).

    python torch_eager.py [--iters 20] [--tf32] [--json FILE]

Needs torch with CUDA, torchvision and transformers; no network (no weights are downloaded).
Exits 2 when there is no CUDA device.
"""

import argparse
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls/convolutions (off: fp32)")
    ap.add_argument("--json", help="also write [{model, batch, p50, p99}] here (ms)")
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("torch_eager: no CUDA device visible to torch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device("cuda")
    torch.manual_seed(0)

    models = []
    try:
        import torchvision

        models.append(("resnet50", torchvision.models.resnet50(weights=None), "image"))
        models.append(("mobilenet_v2", torchvision.models.mobilenet_v2(weights=None), "image"))
    except Exception as e:  # keep going with what is there
        print(f"torch_eager: torchvision unavailable: {e}", file=sys.stderr)
    try:
        from transformers import BertConfig, BertModel

        models.append(("bert", BertModel(BertConfig()), "tokens"))
    except Exception as e:
        print(f"torch_eager: transformers unavailable: {e}", file=sys.stderr)

    print(f"## PyTorch eager on {torch.cuda.get_device_name(0)} (torch {torch.__version__}, "
          f"TF32 {'on' if args.tf32 else 'off'}; ms, {args.iters} runs after 3 warm-ups)\n")
    rows = []
    print("| model | batch | p50 | p99 | mean |")
    print("|---|---|---|---|---|")
    for name, model, kind in models:
        model = model.to(dev).eval()
        for batch in (1, 8):
            if kind == "image":
                x = (torch.rand(batch, 3, 224, 224, device=dev) * 2 - 1,)
            else:
                x = (torch.randint(0, 30522, (batch, 128), device=dev),)
            times = []
            with torch.inference_mode():
                for i in range(args.iters + 3):
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    model(*x)
                    torch.cuda.synchronize()
                    if i >= 3:
                        times.append((time.perf_counter() - t) * 1e3)
            times.sort()
            p = lambda q: times[round((len(times) - 1) * q)]
            print(f"| {name} | {batch} | {p(0.5):.2f} | {p(0.99):.2f} | {statistics.mean(times):.2f} |")
            rows.append({"model": name, "batch": batch, "p50": p(0.5), "p99": p(0.99)})
        del model
        torch.cuda.empty_cache()
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
