#!/usr/bin/env python3
"""Plots `make bench-scale`'s CSV: pods scheduled per second (GPU and plain)
and the extender's latency against the number of simulated nodes.

    hack/plot-scale.py target/bench-scale/scale.csv docs/images/bench-scale.png

Needs matplotlib (`make bench-scale` installs it into a virtual environment
in the tool cache when the system has none)."""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(source, target):
    with open(source, newline="") as f:
        rows = sorted(csv.DictReader(f), key=lambda r: float(r["nodes"]))
    if not rows:
        sys.exit(f"{source}: no rows")
    nodes = [int(float(r["nodes"])) for r in rows]
    col = lambda name: [float(r[name]) for r in rows]  # noqa: E731

    fig, (rate, latency) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    rate.plot(nodes, col("plain_pods_per_s"), "o-", label="plain pods (default profile)")
    rate.plot(nodes, col("gpu_pods_per_s"), "s-", label="GPU pods (Tessera extender)")
    rate.set_xscale("log")
    rate.set_xlabel("simulated nodes (8 GPUs each)")
    rate.set_ylabel("pods bound per second")
    rate.set_title("Burst of pods, real kube-scheduler")
    rate.set_ylim(bottom=0)
    rate.grid(True, which="both", alpha=0.3)
    rate.legend()

    for name, label, style in [
        ("http_filter_prioritize_p99_ms", "Filter+Prioritize over HTTP, p99", "o-"),
        ("http_filter_prioritize_p50_ms", "Filter+Prioritize over HTTP, p50", "o--"),
        ("filter_p99_ms", "Filter in the extender, p99", "s-"),
        ("bind_p99_ms", "Bind in the extender, p99", "^-"),
    ]:
        latency.plot(nodes, col(name), style, label=label)
    latency.set_xscale("log")
    latency.set_yscale("log")
    latency.set_xlabel("simulated nodes (8 GPUs each)")
    latency.set_ylabel("milliseconds")
    latency.set_title("Extender latency")
    latency.grid(True, which="both", alpha=0.3)
    latency.legend(fontsize="small")

    fig.tight_layout()
    fig.savefig(target)
    print(f"wrote {target}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
