#!/usr/bin/env python3
"""Plot loss, learning rate and throughput of one or several runs to a PNG.

usage: plot_metrics.py RUN [RUN ...] [-o out.png]
  RUN is a run directory (holding metrics.jsonl) or a metrics.jsonl file; several runs are
  overlaid (labelled by run directory name) for comparison. Validation losses, when present,
  are drawn as markers on the loss panel.
"""
import argparse
import json
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    train, valid = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"error: {path}:{n}: not JSON ({e})")
            if "valid_loss" in rec:
                valid.append(rec)
            elif "loss" in rec:
                train.append(rec)
    label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
    return label, train, valid


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("-o", "--out", default="metrics.png")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("error: matplotlib is needed for plots (make deps installs python3-matplotlib)")

    runs = [load(r) for r in args.runs]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, train, valid in runs:
        steps = [r["step"] for r in train]
        axes[0].plot(steps, [r["loss"] for r in train], label=f"{label} train", linewidth=1)
        if valid:
            axes[0].plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o--",
                         label=f"{label} valid", markersize=4)
        axes[1].plot(steps, [r["lr"] for r in train], label=label)
        axes[2].plot(steps, [r.get("tokens_per_s", 0) for r in train], label=label, linewidth=1)
    for ax, title, ylabel in zip(axes, ["loss", "learning rate", "throughput"],
                                 ["cross-entropy (nats/token)", "lr", "tokens / s"]):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out} ({len(runs)} run(s))")


if __name__ == "__main__":
    main()
