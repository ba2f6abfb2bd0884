#!/usr/bin/env python3
"""Compile every kernels/cuda/*.cu to PTX for sm_90 with NVRTC, then assemble it with ptxas.

Needs no GPU and no CUDA toolkit: libnvrtc comes from the PyPI wheel `nvidia-cuda-nvrtc-cu12`
(site-packages/nvidia/cuda_nvrtc/lib) and ptxas from `nvidia-cuda-nvcc-cu12`
(site-packages/nvidia/cuda_nvcc/bin/ptxas), both pinned in xtask/requirements.txt.

    python compile_check.py [DIR] [--arch 90] [--keep OUTDIR]

Checks, each a failure with the tool's own log:
  * every .cu starts with a comment, and that comment names each of the file's kernels;
  * `#include "x.cuh"` lines are replaced by that header (as the runtime does) before compiling;
  * NVRTC compiles it with no error and no warning (the same options the runtime will use);
  * kernel names are unique across all files (the launcher may load them into one namespace);
  * ptxas assembles the PTX for sm_<arch>;
  * no kernel spills registers to local memory, unless it is listed in ALLOWED_SPILLS with the reason.
Prints a table per kernel: registers, stack frame, spill stores/loads, static shared memory, barriers.
Exits 0 when everything passed, 1 otherwise.
"""

import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

# Kernels allowed to spill, with why. Empty: nothing spills today, and a new spill is a failure
# until someone looks at it and either fixes it or writes the reason down here.
ALLOWED_SPILLS = {}

# The options the runtime passes to NVRTC as well (besides the architecture).
NVRTC_OPTIONS = ["-default-device", "--std=c++17"]


def site_dirs():
    dirs = []
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and p not in dirs:
            dirs.append(p)
    for p in sys.path:
        if p and os.path.isdir(p) and p not in dirs:
            dirs.append(p)
    return dirs


def find_one(patterns, what, wheel):
    for d in site_dirs():
        for pat in patterns:
            hits = sorted(glob.glob(os.path.join(d, pat)))
            if hits:
                return hits[0]
    sys.exit(f"compile_check: {what} not found; install the PyPI wheel {wheel} into {sys.executable}'s environment "
             f"(searched {', '.join(site_dirs())})")


class Nvrtc:
    def __init__(self, path):
        libdir = os.path.dirname(path)
        # libnvrtc dlopens its builtins library by soname; load it first from the same folder so that
        # no LD_LIBRARY_PATH is needed.
        for b in sorted(glob.glob(os.path.join(libdir, "libnvrtc-builtins.so*"))):
            if ".alt." not in b:
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                break
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        self.path = path

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(rc).decode()}")

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        return f"{major.value}.{minor.value}"

    def compile(self, src, name, options):
        """Returns (ok, log, ptx)."""
        prog = ctypes.c_void_p()
        self.check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None),
                   "nvrtcCreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
            log = buf.value.decode(errors="replace").strip()
            if rc != 0:
                return False, f"{self.lib.nvrtcGetErrorString(rc).decode()}\n{log}", None
            self.check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
            buf = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
            return True, log, buf.value.decode()
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


INCLUDE_RE = re.compile(r'^#include "([\w.]+)"[ \t]*$', re.M)


def resolve_includes(src, folder):
    """Replaces each `#include "x.cuh"` line with that header from `folder`, as the runtime does
    (kernels/src/cuda.rs): NVRTC then compiles one self-contained source."""
    def header(m):
        with open(os.path.join(folder, m.group(1))) as f:
            return f.read()
    return INCLUDE_RE.sub(header, src)


KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?void\s+(\w+)\s*\(')


def header_comment(src):
    """The leading comment block (// lines or one /* */ block), or '' if the file does not start with one."""
    s = src.lstrip()
    if s.startswith("/*"):
        end = s.find("*/")
        return s[: end + 2] if end >= 0 else ""
    lines = []
    for line in s.splitlines():
        if line.strip().startswith("//"):
            lines.append(line)
        else:
            break
    return "\n".join(lines)


def parse_ptxas(log):
    """Per kernel: registers, stack, spill stores, spill loads, smem bytes, barriers."""
    info = {}
    cur = None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            cur = m.group(1)
            info[cur] = {"regs": 0, "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0, "barriers": 0}
            continue
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            cur = m.group(1) if m.group(1) in info else cur
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            info[cur]["stack"], info[cur]["spill_st"], info[cur]["spill_ld"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            info[cur]["regs"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            if b:
                info[cur]["barriers"] = int(b.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            if s:
                info[cur]["smem"] = int(s.group(1))
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--arch", default="90", help="compute capability, e.g. 90 for sm_90 (H100/H200)")
    ap.add_argument("--keep", help="write the PTX and cubins here instead of a temporary folder")
    args = ap.parse_args()

    sources = sorted(glob.glob(os.path.join(args.dir, "*.cu")))
    if not sources:
        print(f"compile_check: no .cu files in {args.dir}")
        return 1

    nvrtc = Nvrtc(find_one(["nvidia/cuda_nvrtc/lib/libnvrtc.so.*[0-9]", "nvidia/cuda_nvrtc/lib/libnvrtc.so"],
                           "libnvrtc", "nvidia-cuda-nvrtc-cu12"))
    ptxas = find_one(["nvidia/cuda_nvcc/bin/ptxas"], "ptxas", "nvidia-cuda-nvcc-cu12")
    ptxas_ver = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    print(f"NVRTC {nvrtc.version()} ({nvrtc.path})")
    print(f"ptxas {ptxas_ver[-1] if ptxas_ver else '?'} ({ptxas})")
    options = [f"--gpu-architecture=compute_{args.arch}"] + NVRTC_OPTIONS
    print(f"NVRTC options: {' '.join(options)}; ptxas -arch=sm_{args.arch} -v")

    failures = []
    rows = []
    seen = {}
    tmp = None
    if args.keep:
        outdir = args.keep
        os.makedirs(outdir, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="cotenant-ptx-")
        outdir = tmp.name

    for path in sources:
        fname = os.path.basename(path)
        with open(path) as f:
            src = f.read()
        kernels = KERNEL_RE.findall(src)
        if not kernels:
            failures.append(f'{fname}: no extern "C" __global__ kernel')
        head = header_comment(src)
        if not head:
            failures.append(f"{fname}: does not start with a comment describing its kernels")
        for k in kernels:
            if head and not re.search(r"\b" + re.escape(k) + r"\b", head):
                failures.append(f"{fname}: kernel {k} is not described in the header comment")
            if k in seen:
                failures.append(f"{fname}: kernel {k} is also defined in {seen[k]}")
            seen[k] = fname

        ok, log, ptx = nvrtc.compile(resolve_includes(src, args.dir), fname, options)
        if not ok:
            failures.append(f"{fname}: NVRTC failed:\n{log}")
            continue
        if log:
            failures.append(f"{fname}: NVRTC warnings (not allowed):\n{log}")
        ptx_path = os.path.join(outdir, fname[:-3] + ".ptx")
        with open(ptx_path, "w") as f:
            f.write(ptx)
        cubin = os.path.join(outdir, fname[:-3] + ".cubin")
        r = subprocess.run([ptxas, f"-arch=sm_{args.arch}", "-v", "-o", cubin, ptx_path],
                           capture_output=True, text=True)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0:
            failures.append(f"{fname}: ptxas failed (exit {r.returncode}):\n{out}")
            continue
        warn = [l for l in out.splitlines() if "warning" in l.lower()]
        if warn:
            failures.append(f"{fname}: ptxas warnings (not allowed):\n" + "\n".join(warn))
        info = parse_ptxas(out)
        for k in kernels:
            if k not in info:
                failures.append(f"{fname}: ptxas did not report kernel {k} (is it really extern \"C\" __global__?)")
        for k in sorted(info):
            i = info[k]
            note = ""
            if i["spill_st"] or i["spill_ld"]:
                if k in ALLOWED_SPILLS:
                    note = f"spill allowed: {ALLOWED_SPILLS[k]}"
                else:
                    note = "SPILLS"
                    failures.append(f"{fname}: kernel {k} spills {i['spill_st']} B stores / {i['spill_ld']} B loads")
            rows.append((fname, k, i["regs"], i["stack"], i["spill_st"], i["spill_ld"], i["smem"], i["barriers"], note))

    hdr = ("file", "kernel", "regs", "stack B", "spill st B", "spill ld B", "smem B", "bars", "")
    widths = [max(len(str(r[c])) for r in rows + [hdr]) for c in range(len(hdr))]
    print()
    print("  ".join(str(h).ljust(w) if c < 2 else str(h).rjust(w) for c, (h, w) in enumerate(zip(hdr, widths))).rstrip())
    for r in rows:
        print("  ".join(str(v).ljust(w) if c < 2 or c == 8 else str(v).rjust(w)
                        for c, (v, w) in enumerate(zip(r, widths))).rstrip())
    print()
    print(f"{len(sources)} files, {len(rows)} kernels, sm_{args.arch}")
    if tmp:
        tmp.cleanup()
    if failures:
        print(f"\n{len(failures)} FAILURE(S):")
        for f in failures:
            print(f"- {f}")
        return 1
    print("all kernels compiled without spills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
