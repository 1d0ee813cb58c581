#!/usr/bin/env python3
"""Plots of bench/compare.sh's sweeps: bandwidth and latency against message size.

    plot.py --bw sweep_bw.csv --lat sweep_lat.csv --outdir DIR [--title TEXT]

Each CSV has a header and rows "series,size_bytes,value" (GB/s or µs); values that are not
numbers (a run that failed) are left out. A series whose value is the same at every size
(a ceiling measured once) is drawn as a dashed horizontal line. Writes DIR/bandwidth.png
and DIR/latency.png.
"""
import argparse
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the non-interactive backend)
import matplotlib.ticker  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402


def read_series(path):
    """{series: [(size, value), ...]} in file order, skipping rows that are not numbers."""
    series = {}
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows, None)
        for row in rows:
            if len(row) != 3:
                continue
            name, size, value = row
            try:
                point = (int(size), float(value))
            except ValueError:
                continue
            series.setdefault(name, []).append(point)
    return series


def size_label(n, _pos=None):
    for unit, factor in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor:
            return f"{n / factor:g} {unit}"
    return f"{n:g} B"


def plot(series, ylabel, title, path, logy):
    fig, ax = plt.subplots(figsize=(9, 5.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, points) in enumerate(series.items()):
        if not points:
            continue
        points.sort()
        sizes = [p[0] for p in points]
        values = [p[1] for p in points]
        color = colors[i % len(colors)]
        if len(set(values)) == 1 and len(values) > 1:
            ax.axhline(values[0], linestyle="--", linewidth=1.2, color=color, label=f"{name}: {values[0]:g}")
        else:
            ax.plot(sizes, values, marker="o", markersize=3.5, linewidth=1.5, color=color, label=name)
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    measured = sorted({p[0] for points in series.values() for p in points})
    if measured:
        ax.set_xticks(measured)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(size_label))
    ax.set_xlabel("message size")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.autofmt_xdate(rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot.py: wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bw", required=True)
    ap.add_argument("--lat", required=True)
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    suffix = f" — {a.title}" if a.title else ""
    plot(read_series(a.bw), "bandwidth, GB/s (1e9 B/s)", "Bandwidth against message size" + suffix,
         os.path.join(a.outdir, "bandwidth.png"), logy=False)
    plot(read_series(a.lat), "one-way latency, µs (median)", "Latency against message size" + suffix,
         os.path.join(a.outdir, "latency.png"), logy=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
