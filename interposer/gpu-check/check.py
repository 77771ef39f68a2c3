#!/usr/bin/env python3
"""Real-GPU validation of Tessera's interposer (libtessera_vgpu.so).

Run on a machine with an NVIDIA GPU, its driver, nvidia-smi and PyTorch with
CUDA. Every measurement runs in a fresh child process, so the limits in its
environment apply from the first CUDA call, exactly as in a container that the
node agent has served:

    python3 interposer/gpu-check/check.py --library target/release/libtessera_vgpu.so

It prints one table. Nothing is assumed: a check that cannot run says why.

Checks
  oom        torch allocations past CUDA_DEVICE_MEMORY_LIMIT_0 fail with CUDA
             out-of-memory at the limit: the context's own memory counts
             (as in HAMi), so torch gets what was free after it, to within
             one 256 MiB step
  meminfo    torch.cuda.mem_get_info() total equals the limit
  smi        nvidia-smi, preloaded, reports the limit as memory.total
  matmul     fp16 matmul without the preload, and preloaded at
             CUDA_DEVICE_SM_LIMIT 30 and 100: the share of the GPU's time
             the child's work took (NVML's per-process samples, through
             nvidia-ml-py), which must be 30 +- 5 % at limit 30, with
             TFLOP/s and the SM clock beside it (a GPU busy 30 % of the time
             runs at higher clocks, so throughput is above 30 %)
  inference  a small-batch MLP inference loop, p50/p99 per batch, with and
             without the preload
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

MIB = 1 << 20


def child_env(library, memory_mib=None, sm_limit=None, region=None):
    env = dict(os.environ)
    if library:
        env["LD_PRELOAD"] = os.path.abspath(library)
        # The shared accounting region, one per run as one per container.
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = region
        env["GPU_CORE_UTILIZATION_POLICY"] = "force"
    if memory_mib is not None:
        env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{memory_mib}m"
    if sm_limit is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(sm_limit)
    env["CUDA_VISIBLE_DEVICES"] = "0"
    return env


def run_child(mode, env, *args, script=__file__, wrap=(), observe=False):
    """Runs `script` (this one by default) in `mode` in a child, under the
    `wrap` command if given; returns its JSON answer. With `observe`, adds
    `sm_util`: the child's mean NVML utilisation while it worked (see
    `Observer`), and `sm_clock_mhz`."""
    command = [*wrap, sys.executable, os.path.abspath(script), "--child", mode, *map(str, args)]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    observer = Observer(child.pid) if observe else None
    try:
        stdout, stderr = child.communicate(timeout=600)
    finally:
        if observer:
            observer.finish()
    lines = [l for l in stdout.splitlines() if l.startswith("{")]
    if child.returncode != 0 or not lines:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"error": f"exit {child.returncode}: {' | '.join(tail)}"}
    answer = json.loads(lines[-1])
    if observer:
        answer.update(observer.summary())
    return answer


class Observer(threading.Thread):
    """Samples NVML while a child runs: the child's per-process SM
    utilisation (each driver sample is the share of the period before it:
    every 200 ms on an H100) and the SM clock. The compute limit is a share
    of the GPU's time, which is what these samples measure; throughput may
    be higher, since a GPU that idles part of the time runs at higher
    clocks."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.util, self.clocks, self.error = pid, [], [], None
        self.done = threading.Event()
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.nvml, self.device = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as error:  # no NVML bindings: the row says so
            self.error = f"no NVML ({error})"
            return
        self.start()

    def run(self):
        nvml, last = self.nvml, int(time.time() * 1e6)
        while not self.done.wait(0.1):
            try:
                for sample in nvml.nvmlDeviceGetProcessUtilization(self.device, last):
                    last = max(last, sample.timeStamp)
                    if sample.pid == self.pid:
                        self.util.append(sample.smUtil)
            except nvml.NVMLError:
                pass  # no sample newer than `last` yet
            if nvml.nvmlDeviceGetUtilizationRates(self.device).gpu > 0:
                self.clocks.append(nvml.nvmlDeviceGetClockInfo(self.device, nvml.NVML_CLOCK_SM))

    def finish(self):
        self.done.set()
        if self.is_alive():
            self.join()

    def summary(self):
        if self.error:
            return {"sm_util": None, "why": self.error}
        # The samples while the child worked: from its first busy one to its
        # last, without those two (they cover start-up and exit in part).
        busy = [i for i, u in enumerate(self.util) if u > 0]
        core = self.util[busy[0] + 1:busy[-1]] if len(busy) > 2 else []
        return {
            "sm_util": round(sum(core) / len(core), 1) if core else None,
            "sm_clock_mhz": round(sum(self.clocks) / len(self.clocks)) if self.clocks else None,
        }


# ----- child modes (run with the environment under test) -----

def child_oom(step_mib):
    import torch

    free, _ = torch.cuda.mem_get_info()  # the context's own memory is already charged
    held, total = [], 0
    try:
        while True:
            held.append(torch.empty(step_mib * MIB, dtype=torch.uint8, device="cuda"))
            total += step_mib
    except torch.cuda.OutOfMemoryError as error:
        return {"free_at_start_mib": free // MIB, "allocated_mib": total, "refused": "out of memory" in str(error).lower()}


def child_meminfo():
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"free_mib": free // MIB, "total_mib": total // MIB}


def child_matmul(seconds):
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
        if count % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    return {"tflops": 2 * n**3 * count / elapsed / 1e12}


def child_inference(iterations, batch):
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
        torch.nn.Linear(4096, 1000),
    ).cuda().half().eval()
    x = torch.randn(batch, 1024, device="cuda", dtype=torch.float16)
    times = []
    with torch.no_grad():
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        for _ in range(iterations):
            started = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    times.sort()
    return {
        "p50_ms": times[len(times) // 2] * 1e3,
        "p99_ms": times[int(len(times) * 0.99) - 1] * 1e3,
    }


def child_main(mode, args):
    modes = {
        "oom": lambda: child_oom(int(args[0])),
        "meminfo": child_meminfo,
        "matmul": lambda: child_matmul(float(args[0])),
        "inference": lambda: child_inference(int(args[0]), int(args[1])),
    }
    print(json.dumps(modes[mode]()))


# ----- the orchestrator -----

def smi_total(env):
    done = subprocess.run(
        ["nvidia-smi", "--id=0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    if done.returncode != 0:
        return None, (done.stderr or done.stdout).strip()
    return int(done.stdout.strip().splitlines()[0]), None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", default="target/release/libtessera_vgpu.so")
    parser.add_argument("--limit-mib", type=int, default=4096)
    parser.add_argument("--seconds", type=float, default=10.0, help="per matmul measurement")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child_main(options.child[0], options.child[1:])
        return 0
    if not os.path.exists(options.library):
        print(f"--library {options.library}: no such file (build it: cargo build --release -p tessera-interposer)")
        return 2

    region_dir = f"/tmp/tessera-gpu-check-{os.getpid()}"
    os.makedirs(region_dir, exist_ok=True)
    counter = iter(range(1000))

    def limited(memory=None, sm=None):
        return child_env(options.library, memory, sm, f"{region_dir}/region-{next(counter)}")

    bare = child_env(None)
    limit = options.limit_mib
    rows = []

    # The context's memory counts against the limit (as in HAMi): torch gets
    # what was free after the context, to within one 256 MiB step.
    oom = run_child("oom", limited(memory=limit), 256)
    ok = ("error" not in oom and oom["refused"] and oom["free_at_start_mib"] <= limit
          and oom["free_at_start_mib"] - 256 < oom["allocated_mib"] <= oom["free_at_start_mib"])
    rows.append(("oom", f"limit {limit} MiB", json.dumps(oom), "pass" if ok else "FAIL"))

    info = run_child("meminfo", limited(memory=limit))
    ok = "error" not in info and info["total_mib"] == limit and info["free_mib"] <= limit
    rows.append(("meminfo", f"total == {limit} MiB", json.dumps(info), "pass" if ok else "FAIL"))

    total, error = smi_total(limited(memory=limit))
    real, _ = smi_total(bare)
    ok = total == limit
    rows.append(("smi", f"memory.total == {limit} MiB", error or f"{total} MiB (unlimited: {real} MiB)", "pass" if ok else "FAIL"))

    base = run_child("matmul", bare, options.seconds, observe=True)
    at100 = run_child("matmul", limited(sm=100), options.seconds, observe=True)
    at30 = run_child("matmul", limited(sm=30), options.seconds, observe=True)
    if all("error" not in r for r in (base, at100, at30)):
        def shown(r):
            return (f"{r['tflops']:.1f} TFLOP/s ({r['tflops'] / base['tflops']:.0%}), "
                    f"GPU time {r.get('sm_util')} %, SM clock {r.get('sm_clock_mhz')} MHz")
        rows.append(("matmul", "no preload", shown(base), ""))
        rows.append(("matmul", "SM limit 100", shown(at100), ""))
        util = at30.get("sm_util")
        verdict = "skip" if util is None else ("pass" if abs(util - 30) <= 5 else "FAIL")
        rows.append(("matmul", "SM limit 30: GPU time 30 +- 5 %", at30.get("why") or shown(at30), verdict))
    else:
        rows.append(("matmul", "", json.dumps([base, at100, at30]), "FAIL"))

    plain = run_child("inference", bare, 500, 8)
    preloaded = run_child("inference", limited(memory=limit), 500, 8)
    if "error" not in plain and "error" not in preloaded:
        rows.append(("inference", "batch 8, no preload", f"p50 {plain['p50_ms']:.3f} ms, p99 {plain['p99_ms']:.3f} ms", ""))
        rows.append(("inference", "batch 8, preloaded", f"p50 {preloaded['p50_ms']:.3f} ms, p99 {preloaded['p99_ms']:.3f} ms", ""))
    else:
        rows.append(("inference", "", json.dumps([plain, preloaded]), "FAIL"))

    return report("Tessera interposer", 0, rows)


def report(title, gpu_index, rows):
    """Prints the rows (check, setting, result, verdict) under a title naming
    the GPU and the date; returns the exit status: 1 if any row failed."""
    gpu = subprocess.run(["nvidia-smi", f"--id={gpu_index}", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print(f"{title} on {gpu or 'unknown GPU'}, {time.strftime('%Y-%m-%d')}")
    width = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, width)))
    return 0 if all(r[3] != "FAIL" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
