#!/usr/bin/env python3
"""Real-GPU validation of what Tessera's MIG and MPS modes rely on.

Run as root on a machine with an NVIDIA GPU, its driver, nvidia-smi,
nvidia-cuda-mps-control and PyTorch with CUDA:

    python3 interposer/gpu-check/modes.py [--gpu 0] [--mps-limit-mib 4096]

It prints one table. It never changes the GPU's MIG mode and never resets
the GPU: a check whose precondition is missing says so and is skipped.

Checks
  mig-profiles  `nvidia-smi mig -lgip` against Tessera's table for the model
                (api/src/mig.rs): profile IDs, instance counts, memory (MiB)
  mig-create    creates the smallest profile's GPU instance and compute
                instance (as the node agent does at Allocate), finds its MIG
                UUID, and destroys both again
  mig-torch     PyTorch in that instance (CUDA_VISIBLE_DEVICES=<MIG UUID>):
                mem_get_info total and how much it can allocate, against the
                profile's memory
  mps-limit     an MPS control daemon with its own pipe and log directories
                (as the agent runs one per GPU); a client with
                CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<limit>M allocates until
                refused, which must happen at the limit
  mps-threads   fp16 matmul TFLOP/s of a client at
                CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 30 against 100
  mps-readonly  the same client with the pipe directory bind-mounted
                read-only (as Allocate mounts it): it must still reach the
                server (needs unshare and mount)
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import check  # the interposer's checks, beside this script: the child runner, matmul, the report

MIB = 1 << 20

# Tessera's tables (api/src/mig.rs; a test there keeps these equal):
# model substrings -> {profile: (NVML id, most instances, MiB)}.
TABLES = {
    ("A100", "80GB"): {
        "1g.10gb": (19, 7, 9728), "1g.10gb+me": (20, 1, 9728), "1g.20gb": (15, 4, 19968),
        "2g.20gb": (14, 3, 19968), "3g.40gb": (9, 2, 40192), "4g.40gb": (5, 1, 40192),
        "7g.80gb": (0, 1, 80896),
    },
    ("A100", "40GB"): {
        "1g.5gb": (19, 7, 4864), "1g.5gb+me": (20, 1, 4864), "1g.10gb": (15, 4, 9856),
        "2g.10gb": (14, 3, 9856), "3g.20gb": (9, 2, 19968), "4g.20gb": (5, 1, 19968),
        "7g.40gb": (0, 1, 40192),
    },
    ("H100", "80GB"): {
        "1g.10gb": (19, 7, 9984), "1g.10gb+me": (20, 1, 9984), "1g.20gb": (15, 4, 20096),
        "2g.20gb": (14, 3, 20096), "3g.40gb": (9, 2, 40448), "4g.40gb": (5, 1, 40448),
        "7g.80gb": (0, 1, 81152),
    },
}


def sh(args, env=None, stdin=None, timeout=120):
    done = subprocess.run(args, env=env, input=stdin, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def run_child(mode, env, *args, wrap=()):
    """Runs this script in `mode` in a child (check.py's runner)."""
    return check.run_child(mode, env, *args, script=__file__, wrap=wrap)


# ----- child modes -----

def child_alloc(step_mib):
    import torch

    free, total = torch.cuda.mem_get_info()
    held, allocated = [], 0
    try:
        while allocated < 1 << 20:
            held.append(torch.empty(step_mib * MIB, dtype=torch.uint8, device="cuda"))
            allocated += step_mib
    except torch.cuda.OutOfMemoryError:
        pass
    return {"total_mib": total // MIB, "free_mib": free // MIB, "allocated_mib": allocated}


# ----- MIG -----

def table_for(model):
    upper = model.upper()
    for (chip, size), table in TABLES.items():
        if chip in upper and size in upper:
            return table
    return None


def lgip(gpu):
    """Profiles as `nvidia-smi mig -lgip` prints them: name -> (id, total, MiB)."""
    code, out, err = sh(["nvidia-smi", "mig", "-i", str(gpu), "-lgip"])
    if code != 0:
        return None, (err or out).strip()
    profiles = {}
    for line in out.splitlines():
        match = re.search(r"MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)", line)
        if match:
            name, pid, _free, total, gib = match.groups()
            profiles[name] = (int(pid), int(total), round(float(gib) * 1024))
    return profiles, None


def mig_uuids(gpu):
    _, out, _ = sh(["nvidia-smi", "-L"])
    uuids, index = [], -1
    for line in out.splitlines():
        match = re.match(r"GPU (\d+):", line)
        if match:
            index = int(match.group(1))
            continue
        found = re.search(r"\(UUID: (MIG-[^)]+)\)", line)
        if found and index == gpu:
            uuids.append(found.group(1))
    return uuids


def check_mig(gpu, rows, create=True):
    code, out, _ = sh(["nvidia-smi", "-i", str(gpu), "--query-gpu=name,mig.mode.current", "--format=csv,noheader"])
    if code != 0 or "," not in out:
        rows.append(("mig-profiles", "", "nvidia-smi cannot report MIG mode", "skip"))
        return
    model, mode = [s.strip() for s in out.strip().split(",", 1)]
    if mode != "Enabled":
        rows.append(("mig-*", model, f"MIG mode is {mode}; this script does not change it (nvidia-smi -i {gpu} -mig 1 on an idle GPU)", "skip"))
        return
    profiles, error = lgip(gpu)
    if profiles is None:
        rows.append(("mig-profiles", model, error, "FAIL"))
        return
    table = table_for(model)
    if table is None:
        rows.append(("mig-profiles", model, "Tessera has no table for this model; measured: " + json.dumps(profiles), "info"))
    else:
        wrong = {n: (profiles.get(n), t) for n, t in table.items() if profiles.get(n) != t}
        rows.append(("mig-profiles", model, json.dumps(wrong) if wrong else f"{len(table)} profiles match", "FAIL" if wrong else "pass"))
    if not create:
        rows.append(("mig-create", model, "--no-mig-create: the GPU's instances are left as they are", "skip"))
        return
    smallest = min((p for p in profiles.items() if "+me" not in p[0]), key=lambda p: p[1][2], default=None)
    if smallest is None:
        rows.append(("mig-create", model, "no profile listed", "FAIL"))
        return
    name, (pid, _, mib) = smallest
    before = set(mig_uuids(gpu))
    started = time.perf_counter()
    code, out, err = sh(["nvidia-smi", "mig", "-i", str(gpu), "-cgi", str(pid), "-C"])
    took = time.perf_counter() - started
    if code != 0:
        rows.append(("mig-create", name, (err or out).strip(), "FAIL"))
        return
    gi = re.search(r"GPU instance ID\s+(\d+)", out)
    new = [u for u in mig_uuids(gpu) if u not in before]
    rows.append(("mig-create", name, f"{took:.2f} s, UUID {new[0] if new else '?'}", "pass" if new and gi else "FAIL"))
    try:
        if new:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=new[0])
            got = run_child("alloc", env, 256)
            ok = "error" not in got and abs(got["total_mib"] - mib) <= 64 and got["allocated_mib"] >= mib - 1024
            rows.append(("mig-torch", f"{name} ({mib} MiB)", json.dumps(got), "pass" if ok else "FAIL"))
    finally:
        if gi:
            started = time.perf_counter()
            sh(["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi.group(1), "-dci"])
            code, out, err = sh(["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi.group(1), "-dgi"])
            took = time.perf_counter() - started
            rows.append(("mig-destroy", name, f"{took:.2f} s" if code == 0 else (err or out).strip(), "pass" if code == 0 else "FAIL"))


# ----- MPS -----

def fills_free(got, limit):
    """The MPS client saw at most `limit` free after its context (the
    context counts against the pinned limit) and could allocate all of it,
    to within one 256 MiB step."""
    return ("error" not in got and got["free_mib"] <= limit
            and got["free_mib"] - 256 < got["allocated_mib"] <= got["free_mib"])


def check_mps(gpu, limit, seconds, rows):
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        rows.append(("mps-*", "", "nvidia-cuda-mps-control is not on PATH", "skip"))
        return
    root = tempfile.mkdtemp(prefix="tessera-mps-")
    pipe, log = os.path.join(root, "pipe"), os.path.join(root, "log")
    os.makedirs(pipe, mode=0o755)
    os.makedirs(log, mode=0o755)
    daemon_env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log)
    code, out, err = sh([control, "-d"], env=daemon_env)
    if code != 0:
        rows.append(("mps-*", "", f"starting the daemon: {(err or out).strip()}", "FAIL"))
        return
    try:
        client = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipe, CUDA_MPS_LOG_DIRECTORY=log, CUDA_VISIBLE_DEVICES="0")
        limited = dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={limit}M")
        got = run_child("alloc", limited, 256)
        ok = fills_free(got, limit)
        rows.append(("mps-limit", f"pinned limit {limit} MiB", json.dumps(got), "pass" if ok else "FAIL"))

        full = run_child("matmul", dict(client, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100"), seconds)
        part = run_child("matmul", dict(client, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30"), seconds)
        if "error" in full or "error" in part:
            rows.append(("mps-threads", "", json.dumps([full, part]), "FAIL"))
        else:
            ratio = part["tflops"] / full["tflops"]
            # The percentage limits the SMs a client may use, not its time:
            # throughput follows less than proportionally (an H100 gave 43 %
            # at 30, 2026-11-27), so the check asks for a clear restriction.
            rows.append(("mps-threads", "30 % vs 100 %", f"{part['tflops']:.1f} / {full['tflops']:.1f} TFLOP/s ({ratio:.0%})", "pass" if ratio <= 0.50 else "FAIL"))

        if os.geteuid() != 0 or shutil.which("unshare") is None:
            rows.append(("mps-readonly", "", "needs root and unshare", "skip"))
        else:
            script = f"mount --bind {pipe} {pipe} && mount -o remount,bind,ro {pipe} && exec \"$@\""
            wrap = ["unshare", "-m", "sh", "-c", script, "sh"]
            got = run_child("alloc", limited, 256, wrap=wrap)
            ok = fills_free(got, limit)
            rows.append(("mps-readonly", "pipe dir mounted ro", json.dumps(got), "pass" if ok else "FAIL"))
    finally:
        sh([control], env=daemon_env, stdin="quit\n")
        shutil.rmtree(root, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--mps-limit-mib", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=10.0, help="per matmul measurement")
    parser.add_argument("--no-mig-create", action="store_true",
                        help="compare the profiles only; create no instance (a GPU whose settings are not yours)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        mode, args = options.child[0], options.child[1:]
        modes = {"alloc": lambda: child_alloc(int(args[0])), "matmul": lambda: check.child_matmul(float(args[0]))}
        print(json.dumps(modes[mode]()))
        return 0
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi is not on PATH: no NVIDIA GPU here, nothing checked")
        return 2
    rows = []
    check_mig(options.gpu, rows, create=not options.no_mig_create)
    check_mps(options.gpu, options.mps_limit_mib, options.seconds, rows)
    return check.report("Tessera MIG and MPS checks", options.gpu, rows)


if __name__ == "__main__":
    sys.exit(main())
