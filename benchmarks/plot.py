"""Plot a benchmarks/run.py result: throughput against size with the bandwidth roofline,
and the 1 -> 2 thread scaling of the 4096x4096 cases.

    python benchmarks/run.py --json benchmarks/results.json
    python benchmarks/plot.py benchmarks/results.json -o docs/performance.png

Throughput is the bytes one call reads and writes (x, codes and y; parameters left out)
over its time; the roofline is the copy bandwidth the runner measured on the same machine
in the same run (STREAM counting: bytes read plus bytes written). Needs matplotlib (the
`bench` extra).
"""

from __future__ import annotations

import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLES = {
    "qemu_q": dict(color="C0", marker="o", label="qemu_q (2 threads)"),
    "qemu_q_1t": dict(color="C0", marker="o", linestyle=":", markerfacecolor="none", label="qemu_q (1 thread)"),
    "onnxruntime": dict(color="C1", marker="s", label="onnxruntime (2 threads)"),
    "ml_dtypes": dict(color="C2", marker="^", label="numpy + ml_dtypes cast"),
    "onnx.reference": dict(color="C3", marker="v", label="onnx.reference"),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", help="JSON written by benchmarks/run.py --json")
    p.add_argument("-o", "--output", default="docs/performance.png")
    p.add_argument("--dpi", type=int, default=72)
    args = p.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)

    sweep = results.get("sweep", [])
    cases = []
    for row in sweep:
        if row["case"] not in cases:
            cases.append(row["case"])
    n_panels = len(cases) + (1 if results.get("cases") else 0)
    cols = min(3, max(1, n_panels))
    rows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    axes = [a for row in axes for a in row]
    bandwidth = results.get("bandwidth", {})
    roof2 = bandwidth.get("copy_2t_GBps")
    roof1 = bandwidth.get("copy_1t_GBps")

    for ax, case in zip(axes, cases):
        rows_ = [r for r in sweep if r["case"] == case]
        title = rows_[0]["title"]
        for impl, style in STYLES.items():
            pts = [(r["size"], r["bytes_moved"] / r["times"][impl] / 1e9) for r in rows_
                   if impl in r["times"] and math.isfinite(r["times"][impl])]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, markersize=3.5, linewidth=1.2, **style)
        if roof2:
            ax.axhline(roof2, color="k", linestyle="--", linewidth=0.9, label=f"copy bandwidth, 2 threads ({roof2:.0f} GB/s)")
        if roof1:
            ax.axhline(roof1, color="gray", linestyle=":", linewidth=0.9, label=f"copy bandwidth, 1 thread ({roof1:.0f} GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("elements", fontsize=8)
        ax.set_ylabel("GB/s (bytes read + written)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", linewidth=0.3)

    if results.get("cases"):
        ax = axes[len(cases)]
        rows_ = [r for r in results["cases"] if "qemu_q_1t" in r["times"]]
        labels = [r["title"].replace("per-tensor", "tensor").replace("per-axis ", "") for r in rows_]
        speedup = [r["times"]["qemu_q_1t"] / r["times"]["qemu_q"] for r in rows_]
        ypos = range(len(rows_))
        ax.barh(list(ypos), speedup, color="C0", height=0.6)
        ax.axvline(1.0, color="gray", linewidth=0.8)
        ax.axvline(2.0, color="k", linestyle="--", linewidth=0.8)
        ax.set_yticks(list(ypos))
        ax.set_yticklabels(labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("t(1 thread) / t(2 threads)", fontsize=8)
        ax.set_title("qemu_q 1 -> 2 threads, 4096x4096", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes[n_panels:]:
        ax.axis("off")

    handles, labels = [], []
    for ax in axes[:len(cases)]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7, frameon=False)
    machine = results.get("machine", {})
    fig.suptitle(f"qemu_q vs onnxruntime / onnx.reference / ml_dtypes on {machine.get('Model name', '?')}, "
                 f"{machine.get('CPU(s)', '?')} CPUs", fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if handles else 0, 1, 0.95))
    fig.savefig(args.output, dpi=args.dpi)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
