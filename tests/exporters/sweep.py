"""Exports randomly initialised models with PyTorch and checks each against onnxruntime.

Not run by `cargo xtask test` (it needs torch, torchvision and transformers, several GB): a
manual sweep of what real exporters write, over far more architectures than the test suite
holds. For each model it writes the ONNX file with `torch.onnx.export` (the TorchScript
exporter at opset 17, or with --dynamo the torch.export one), optionally rewrites it with
onnxruntime's own tools (--variant ort-extended: its graph optimizer's saved model, with its
fused com.microsoft operators; ort-transformers: its transformer optimizer's, for Hugging Face
models; dynamic, qdq, qoperator: its quantizers; float16: its float16
converter with float inputs and outputs), runs it through `cotenant-agent run` and an
onnxruntime session on the same inputs, and prints the largest difference relative to the
output's magnitude. With --dynamic-axes the batch and sequence axes are symbolic and the run
uses another batch and length than the export did.

Random weights make some comparisons ill-conditioned: where PyTorch itself in float32 and
float64 differ (MobileViT: 16%), or near-equal scores reorder (Mask R-CNN's TopK), a
difference is the model's, not the runtime's. For int8 variants compare with onnxruntime's
own optimised and unoptimised runs, which differ by as much on such models.

Set-up, outside the repository:
  python3 -m venv ~/.cache/scratch-torch
  ~/.cache/scratch-torch/bin/pip install torch torchvision transformers onnx onnxscript onnxruntime
Usage:
  sweep.py --agent target/release/cotenant-agent --work /tmp/sweep \
      [--family torchvision|hf] [--dynamo] [--dynamic-axes] [--variant float|ort-extended|ort-transformers|dynamic|qdq|qoperator|float16] [NAME ...]
"""

import argparse
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import onnx
import onnxruntime as ort

TORCHVISION = ["alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s",
               "googlenet", "inception_v3", "maxvit_t", "mnasnet1_0", "mobilenet_v2",
               "mobilenet_v3_large", "regnet_y_400mf", "resnet50", "resnext50_32x4d",
               "shufflenet_v2_x1_0", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_32",
               "deeplabv3_mobilenet_v3_large", "fcn_resnet50", "lraspp_mobilenet_v3_large",
               "ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn",
               "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "ssd300_vgg16",
               "maskrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn", "r3d_18", "r2plus1d_18",
               "swin3d_t"]
DETECTION = {"ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn",
             "retinanet_resnet50_fpn", "fcos_resnet50_fpn", "ssd300_vgg16", "maskrcnn_resnet50_fpn",
             "keypointrcnn_resnet50_fpn"}
VIDEO = {"r3d_18", "r2plus1d_18", "swin3d_t"}

SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
             vocab_size=1000)
GQA = dict(SMALL, num_key_value_heads=2)
SEQ2SEQ = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000)
CONV_AUDIO = dict(SMALL, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                  num_feat_extract_layers=2, num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=4)
VISION = dict(SMALL, image_size=64, patch_size=16)
STAGES = dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1])
# model type: (config overrides, input kind)
HF = {
    "bert": (SMALL, "text"), "roberta": (SMALL, "text"), "albert": (dict(SMALL, embedding_size=32), "text"),
    "distilbert": (dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=1000), "text"),
    "deberta-v2": (SMALL, "text"), "mobilebert": (dict(SMALL, embedding_size=32, intra_bottleneck_size=32,
                                                      true_hidden_size=32), "text"),
    "mpnet": (SMALL, "text"), "gpt2": (dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000), "text"),
    "gpt_neox": (SMALL, "text"), "llama": (GQA, "text"), "mistral": (GQA, "text"), "qwen2": (GQA, "text"),
    "qwen3": (dict(GQA, head_dim=16), "text"), "phi3": (dict(GQA, pad_token_id=0), "text"),
    "gemma": (dict(GQA, head_dim=16), "text"), "gemma2": (dict(GQA, head_dim=16), "text"),
    "opt": (dict(SMALL, ffn_dim=128, word_embed_proj_dim=64), "text"),
    "bloom": (dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000), "text"), "falcon": (SMALL, "text"),
    "gptj": (dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, rotary_dim=8), "text"),
    "t5": (dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=1000), "seq2seq"),
    "bart": (SEQ2SEQ, "seq2seq"), "wav2vec2": (CONV_AUDIO, "audio"), "hubert": (CONV_AUDIO, "audio"),
    "vit": (VISION, "image"), "beit": (VISION, "image"), "dinov2": (VISION, "image"),
    "clip_vision_model": (VISION, "image"), "clip_text_model": (SMALL, "text"),
    "convnext": (STAGES, "image"), "segformer": (dict(STAGES, decoder_hidden_size=32), "image"),
    "swin": (dict(embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=64, window_size=4), "image"),
    "efficientnet": (dict(image_size=64), "image"), "mobilenet_v2": (dict(image_size=64), "image"),
    "levit": (dict(image_size=64), "image"), "yolos": (dict(VISION, image_size=[64, 64],
                                                            num_detection_tokens=5), "image"),
    "rwkv": (dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, attention_hidden_size=64,
                  intermediate_size=128), "ids"),
    "mamba": (dict(hidden_size=64, num_hidden_layers=2, vocab_size=1000, state_size=8), "ids"),
}

# onnxruntime.transformers.optimizer's model_type for the architectures it names; "bert" else.
TRANSFORMER_TYPES = {"gpt2": "gpt2", "gpt_neox": "gpt2", "opt": "gpt2", "bloom": "gpt2", "gptj": "gpt2",
                     "t5": "t5", "bart": "bart", "vit": "vit", "beit": "vit", "dinov2": "vit",
                     "yolos": "vit", "clip_vision_model": "clip", "clip_text_model": "clip",
                     "swin": "swin"}


def differs(ours, ref):
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return float("inf"), f"{ours.dtype}{list(ours.shape)} vs {ref.dtype}{list(ref.shape)}"
    if ref.dtype.kind != "f":
        n = int(np.count_nonzero(ours != ref))
        return (0.0 if n == 0 else float("inf")), f"{n}/{ref.size} differ"
    if not np.array_equal(np.isnan(ours), np.isnan(ref)):
        return float("inf"), "NaN in different places"
    ok = ~np.isnan(ref)
    scale = float(np.max(np.abs(ref[ok]), initial=0.0)) or 1.0
    err = float(np.max(np.abs(ours[ok].astype(np.float64) - ref[ok]), initial=0.0)) / scale
    return err, f"{err:.1e}"


def check(agent, model, folder, feeds):
    """The worst output's relative error, and a line on every output."""
    os.makedirs(folder, exist_ok=True)
    args = []
    for k, (name, value) in enumerate(feeds.items()):
        path = os.path.join(folder, f"in{k}.npy")
        np.save(path, value)
        args += ["--input", f"{name}={path}"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    refs = session.run(None, feeds)
    out = os.path.join(folder, "ours")
    run = subprocess.run([agent, "run", "--model", model, "--output-dir", out, *args],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return float("inf"), "cotenant-agent run failed: " + (run.stderr.strip().splitlines() or ["?"])[0]
    worst, lines = 0.0, []
    for o, ref in zip(session.get_outputs(), refs):
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in o.name)
        path = os.path.join(out, ("_" + safe if set(safe) == {"."} else safe) + ".npy")
        if not os.path.exists(path):
            return float("inf"), f"no output {o.name!r}"
        err, line = differs(np.load(path), np.asarray(ref))
        worst = max(worst, err)
        lines.append(line)
    return worst, "; ".join(lines[:4])


def torchvision_model(torch, name):
    from torchvision import models
    kw = {} if name not in DETECTION and "deeplab" not in name and "fcn" not in name and "lraspp" not in name \
        else dict(weights_backbone=None)
    m = models.get_model(name, weights=None, **kw).eval()
    # Some heads start at zero (ViT's), which would make the output the same for any input.
    with torch.no_grad():
        for w in m.parameters():
            if w.dim() > 1 and not w.any():
                w.normal_(0.0, 0.02)
    if name in DETECTION:
        return m, ["x"], ([torch.rand(3, 320, 320)],), lambda a: {"x": a[0][0].numpy()}
    shape = (1, 3, 8, 112, 112) if name in VIDEO else (1, 3, 299, 299) if name == "inception_v3" else (1, 3, 224, 224)
    return m, ["x"], (torch.randn(*shape),), None


def hf_model(torch, name, batch=2, seq=16):
    import transformers
    overrides, kind = HF[name]
    cfg = transformers.AutoConfig.for_model(name, **overrides)
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    extra = {} if name in ("rwkv", "mamba") else dict(attn_implementation="eager")
    m = transformers.AutoModel.from_config(cfg, **extra).eval()

    def inputs(batch, seq):
        ids = torch.randint(0, 1000, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[-1, seq - 4:] = 0
        return {"text": (["input_ids", "attention_mask"], (ids, mask)),
                "ids": (["input_ids"], (ids,)),
                "seq2seq": (["input_ids", "attention_mask", "decoder_input_ids"], (ids, mask, ids[:, :5])),
                "audio": (["input_values"], (torch.randn(batch, 1600),)),
                "image": (["pixel_values"], (torch.randn(batch, 3, 64, 64),))}[kind]

    class Outputs(torch.nn.Module):
        def __init__(self, m, keys):
            super().__init__()
            self.m, self.keys = m, keys

        def forward(self, *a):
            o = self.m(**dict(zip(self.keys, a)), return_dict=True)
            return tuple(v for v in o.values() if isinstance(v, torch.Tensor))[:2]

    keys, args = inputs(batch, seq)
    return Outputs(m, keys).eval(), keys, args, inputs


def variant(path, kind, feeds):
    """`path` rewritten by onnxruntime's tools as `kind`; the new file's path."""
    if kind == "float":
        return path
    out = path[:-5] + f"-{kind}.onnx"
    if kind == "ort-extended":
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = out
        ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        return out
    if kind == "ort-transformers":
        # onnxruntime's transformer optimizer: Attention, MultiHeadAttention, SkipLayerNorm,
        # BiasGelu and the like, fused for the architecture it is told.
        from onnxruntime.transformers.optimizer import optimize_model
        name = os.path.basename(path)[:-5]
        model_type = TRANSFORMER_TYPES.get(name, "bert")
        cfg = HF[name][0]
        heads = cfg.get("num_attention_heads", cfg.get("n_head", cfg.get("num_heads", 4)))
        hidden = cfg.get("hidden_size", cfg.get("n_embd", cfg.get("d_model", 64)))
        # A list (heads per stage): 0, which has the optimizer read them from the graph.
        heads, hidden = (0, 0) if isinstance(heads, list) else (heads, hidden)
        optimize_model(path, model_type=model_type, num_heads=heads, hidden_size=hidden,
                       opt_level=0).save_model_to_file(out)
        return out
    if kind == "float16":
        from onnxruntime.transformers.float16 import convert_float_to_float16
        onnx.save(convert_float_to_float16(onnx.load(path), keep_io_types=True), out)
        return out
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)
    if kind == "dynamic":
        quantize_dynamic(path, out, weight_type=QuantType.QInt8)
        return out

    class Once(CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds])

        def get_next(self):
            return next(self.it, None)

    quantize_static(path, out, Once(), per_channel=True, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8,
                    quant_format=QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--family", choices=["torchvision", "hf"], default="torchvision")
    p.add_argument("--dynamo", action="store_true")
    p.add_argument("--dynamic-axes", action="store_true")
    p.add_argument("--variant", default="float", choices=["float", "ort-extended", "ort-transformers", "dynamic",
                                                     "qdq", "qoperator", "float16"])
    p.add_argument("--tolerance", type=float)
    p.add_argument("names", nargs="*")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    import logging
    logging.disable(logging.WARNING)
    import torch
    torch.manual_seed(0)
    tolerance = a.tolerance or {"float": 1e-4, "ort-extended": 1e-4, "ort-transformers": 1e-4,
                              "float16": 4e-3}.get(a.variant, 1e-2)
    names = a.names or (TORCHVISION if a.family == "torchvision" else list(HF))
    failed = 0
    for name in names:
        start = time.time()
        try:
            if a.family == "torchvision":
                model, keys, args, feeds_of = torchvision_model(torch, name)
                again = None
            else:
                model, keys, args, again = hf_model(torch, name)
                feeds_of = None
            path = os.path.join(a.work, f"{name}.onnx")
            os.makedirs(a.work, exist_ok=True)
            kw = dict(dynamo=a.dynamo, input_names=keys)
            if not a.dynamo:
                kw["opset_version"] = 17
            if a.dynamic_axes and a.family == "hf":
                kw["dynamic_axes"] = {k: {0: "batch", 1: "seq"} if k in ("input_ids", "attention_mask")
                                      else {0: "batch"} for k in keys}
            torch.onnx.export(model, args, path, **kw)
            if a.dynamic_axes and again is not None:
                args = again(3, 11)[1]
            declared = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
            feeds = feeds_of(args) if feeds_of else {k: v.numpy() for k, v in zip(keys, args) if k in declared}
            model_path = variant(path, a.variant, feeds)
            err, detail = check(a.agent, model_path, os.path.join(a.work, name), feeds)
            ok = err <= tolerance
        except Exception as e:  # an exporter or onnxruntime failure is reported, the sweep goes on
            ok, detail = None, f"not checked: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        failed += ok is False
        verdict = {True: "ok", False: "FAILED", None: "skipped"}[ok]
        print(f"{name}: {verdict} {detail} ({time.time() - start:.0f} s)", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
