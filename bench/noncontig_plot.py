#!/usr/bin/env python3
"""Tables, crossovers and plots of bench/noncontig's CSV (bench/noncontig.sh runs it).

  noncontig_plot.py CSV OUTDIR [--label same-host] [--no-plots]

Prints one table per family (throughput in MB/s = 1e6 B/s of payload, median latency in us,
both of the best round, for every N and S, one column per method and figure), then the
crossovers: for each family and N, sgl against pack (and against multi), for throughput and
for latency, each S classed as sgl ahead, the other ahead (by more than 15 %) or a tie; the
crossover is the smallest S from which sgl is never behind, and the largest S up to which the
other is never behind. Writes OUTDIR/<prefix>table.txt, OUTDIR/<prefix>crossovers.csv
and, with matplotlib, OUTDIR/<prefix>{write,read,send}_bw.png and _lat.png: one subplot per N,
S on the x axis, one line per method; OUTDIR/<prefix>ratio.png: sgl's throughput over pack's
and over multi's, one line per N, one subplot per family (the crossovers are where it crosses 1).
"""
import argparse
import csv
import math
import os
import sys
from collections import defaultdict

FAMILIES = ["write", "read", "send"]
METHODS = ["sgl", "pack", "multi"]
LABELS = {
    "sgl": "SGL: one WR, N-entry list",
    "pack": "pack + one WR (+ unpack)",
    "multi": "N WRs (one chained post)",
}


def load(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            for k in ("n", "size", "bytes", "window", "batches", "lat_iters"):
                r[k] = int(r[k])
            for k in ("mbps", "mbps_med", "mbps_min", "lat_us", "lat_med_us", "lat_p90_us"):
                r[k] = float(r[k])
            rows.append(r)
    return rows


def human(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20}M"
    if size >= 1 << 10 and size % (1 << 10) == 0:
        return f"{size >> 10}K"
    return str(size)


def index(rows):
    """(family, n, size) -> {method: row}"""
    by = defaultdict(dict)
    for r in rows:
        by[(r["family"], r["n"], r["size"])][r["method"]] = r
    return by


def table(rows, label):
    by = index(rows)
    out = []
    for fam in FAMILIES:
        keys = sorted(k for k in by if k[0] == fam)
        if not keys:
            continue
        out.append(f"\n{fam.upper()} ({label}): throughput MB/s (1e6 B/s of payload) | median latency us"
                   " (one transfer at a time); best of the rounds")
        head = f"{'N':>3} {'S':>6} {'N*S':>6} |" + "".join(f" {m:>9}" for m in METHODS) + " |" + "".join(
            f" {m:>9}" for m in METHODS) + " | best bw"
        out.append(head)
        out.append("-" * len(head))
        for k in keys:
            ms = by[k]
            bw = [ms[m]["mbps"] if m in ms else float("nan") for m in METHODS]
            lat = [ms[m]["lat_us"] if m in ms else float("nan") for m in METHODS]
            present = [m for m in METHODS if m in ms]
            best = max(present, key=lambda m: ms[m]["mbps"]) if present else "-"
            bad = [m for m in present if ms[m]["check"] != "ok"]
            out.append(f"{k[1]:>3} {human(k[2]):>6} {human(k[1] * k[2]):>6} |" + "".join(f" {v:>9.1f}" for v in bw) +
                       " |" + "".join(f" {v:>9.1f}" for v in lat) + f" | {best}" +
                       (f"  WRONG BYTES: {','.join(bad)}" if bad else ""))
    return "\n".join(out)


TIE = 1.15  # within 15 % either way: a tie (noise on this machine is larger than that)


def classify(points, better_when_high):
    """points: [(size, sgl, other)] -> [(size, 'sgl' | 'other' | 'tie')]."""
    out = []
    for s, a, b in points:
        if a <= 0 or b <= 0 or math.isnan(a) or math.isnan(b):
            continue
        r = a / b if better_when_high else b / a  # > 1: sgl better
        out.append((s, "sgl" if r > TIE else "other" if r < 1 / TIE else "tie"))
    return out


def crossover(cls):
    """The smallest S from which on sgl is never behind (and ahead at least once), and the
    largest S up to which the other is never behind (and ahead at least once)."""
    sgl_from = other_upto = None
    for i in range(len(cls)):
        tail = [c for _, c in cls[i:]]
        if "other" not in tail and "sgl" in tail:
            sgl_from = cls[i][0]
            break
    for j in range(len(cls) - 1, -1, -1):
        head = [c for _, c in cls[:j + 1]]
        if "sgl" not in head and "other" in head:
            other_upto = cls[j][0]
            break
    return sgl_from, other_upto


def crossover_rows(rows):
    by = index(rows)
    result = []
    for fam in FAMILIES:
        for n in sorted({k[1] for k in by if k[0] == fam}):
            sizes = sorted(k[2] for k in by if k[0] == fam and k[1] == n)
            for other in ("pack", "multi"):
                for metric, high in (("mbps", True), ("lat_us", False)):
                    pts = [(s, by[(fam, n, s)]["sgl"][metric], by[(fam, n, s)][other][metric]) for s in sizes
                           if "sgl" in by[(fam, n, s)] and other in by[(fam, n, s)]]
                    cls = classify(pts, high)
                    if not cls:
                        continue
                    sgl_from, other_upto = crossover(cls)
                    result.append({
                        "family": fam, "n": n, "versus": other,
                        "metric": "throughput" if metric == "mbps" else "latency",
                        "sgl_ahead": " ".join(human(s) for s, c in cls if c == "sgl"),
                        "other_ahead": " ".join(human(s) for s, c in cls if c == "other"),
                        "sgl_from": human(sgl_from) if sgl_from else "",
                        "other_upto": human(other_upto) if other_upto else "",
                    })
    return result


def describe(c):
    parts = []
    if c["other_upto"]:
        parts.append(f"{c['versus']} ahead or tied up to {c['other_upto']}")
    if c["sgl_from"]:
        parts.append(f"sgl ahead or tied from {c['sgl_from']} on")
    if not parts:
        parts.append("no clean crossover" if c["sgl_ahead"] and c["other_ahead"] else
                     "tied everywhere" if not c["sgl_ahead"] and not c["other_ahead"] else
                     "sgl never behind" if c["sgl_ahead"] else f"{c['versus']} never behind")
    return "; ".join(parts) + f"  [sgl ahead at: {c['sgl_ahead'] or '-'}; {c['versus']} ahead at: {c['other_ahead'] or '-'}]"


def save(fig, path):
    """Saves a figure as a small PNG (a 64-colour palette when Pillow is there)."""
    fig.savefig(path, dpi=72)
    try:
        from PIL import Image
        Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)
    except ImportError:
        pass


def plots(rows, outdir, prefix, label):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("noncontig_plot: matplotlib missing: no plots", file=sys.stderr)
        return []
    by = index(rows)
    written = []
    for fam in FAMILIES:
        ns = sorted({k[1] for k in by if k[0] == fam})
        if not ns:
            continue
        for metric, ylabel, suffix in (("mbps", "throughput, GB/s of payload", "bw"),
                                       ("lat_us", "median latency, us", "lat")):
            cols = min(3, len(ns))
            rws = math.ceil(len(ns) / cols)
            fig, axes = plt.subplots(rws, cols, figsize=(4.2 * cols, 3.2 * rws), squeeze=False, sharey=True)
            for ax, n in zip(axes.flat, ns):
                sizes = sorted(k[2] for k in by if k[0] == fam and k[1] == n)
                for m in METHODS:
                    xs = [s for s in sizes if m in by[(fam, n, s)]]
                    ys = [by[(fam, n, s)][m][metric] for s in xs]
                    if metric == "mbps":
                        ys = [y / 1000 for y in ys]
                    ax.plot(xs, ys, marker="o", markersize=3, label=LABELS[m])
                ax.set_xscale("log", base=2)
                ax.set_xticks(sizes[::2], [human(x) for x in sizes[::2]])
                ax.set_yscale("log")
                ax.set_title(f"{fam.upper()}, N = {n}")
                ax.set_xlabel("S, bytes per buffer")
                ax.grid(True, which="both", alpha=0.3)
            for ax in axes[:, 0]:
                ax.set_ylabel(ylabel)
            for ax in list(axes.flat)[len(ns):]:
                ax.axis("off")
            axes.flat[0].legend(fontsize=7)
            fig.suptitle(f"uroce, {fam.upper()} of N buffers of S bytes ({label})", fontsize=10)
            fig.tight_layout()
            path = os.path.join(outdir, f"{prefix}{fam}_{suffix}.png")
            save(fig, path)
            plt.close(fig)
            written.append(path)
    # The crossovers at a glance: sgl's throughput over pack's (and over multi's), one line per
    # N, one subplot per family; above 1 the SGL is faster.
    fams = [f for f in FAMILIES if any(k[0] == f for k in by)]
    fig, axes = plt.subplots(2, len(fams), figsize=(4.2 * len(fams), 6.4), squeeze=False, sharey="row")
    for row, other in enumerate(("pack", "multi")):
        for ax, fam in zip(axes[row], fams):
            for n in sorted({k[1] for k in by if k[0] == fam}):
                sizes = sorted(k[2] for k in by if k[0] == fam and k[1] == n)
                xs = [s for s in sizes if "sgl" in by[(fam, n, s)] and other in by[(fam, n, s)]]
                ys = [by[(fam, n, s)]["sgl"]["mbps"] / by[(fam, n, s)][other]["mbps"] for s in xs]
                ax.plot(xs, ys, marker="o", markersize=3, label=f"N = {n}")
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if xs:
                ax.set_xticks(xs[::2], [human(x) for x in xs[::2]])
            ax.set_title(f"{fam.upper()}: sgl / {other} throughput")
            ax.set_xlabel("S, bytes per buffer")
            ax.grid(True, which="both", alpha=0.3)
        axes[row][0].set_ylabel(f"throughput ratio sgl / {other}")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"uroce: above 1 the N-entry SGL is faster ({label})", fontsize=10)
    fig.tight_layout()
    path = os.path.join(outdir, f"{prefix}ratio.png")
    save(fig, path)
    plt.close(fig)
    written.append(path)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("outdir")
    ap.add_argument("--label", default="same-host path")
    ap.add_argument("--prefix", default="noncontig_")
    ap.add_argument("--no-plots", action="store_true")
    a = ap.parse_args()
    rows = load(a.csv)
    if not rows:
        sys.exit(f"noncontig_plot: {a.csv} has no rows")
    os.makedirs(a.outdir, exist_ok=True)
    text = table(rows, a.label)
    cross = crossover_rows(rows)
    lines = [f"\nCrossovers ({a.label}): 'ahead' = better by more than {round((TIE - 1) * 100)} %, else a tie"]
    for c in cross:
        lines.append(f"  {c['family']:<5} N={c['n']:<3} sgl vs {c['versus']:<5} {c['metric']:<10}: {describe(c)}")
    text += "\n" + "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(a.outdir, f"{a.prefix}table.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(a.outdir, f"{a.prefix}crossovers.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["family", "n", "versus", "metric", "sgl_from", "other_upto", "sgl_ahead",
                                          "other_ahead"])
        w.writeheader()
        w.writerows(cross)
    if not a.no_plots:
        for p in plots(rows, a.outdir, a.prefix, a.label):
            print(f"noncontig_plot: wrote {p}", file=sys.stderr)


if __name__ == "__main__":
    main()
