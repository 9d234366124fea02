#!/usr/bin/env python3
"""Compares the per-layer tensor statistics of two runs (run.debug_level = 2) and reports the
first tensor, in computation order (embedding, blocks forward, head gradient, blocks backward),
whose statistics differ beyond the tolerance; e.g. a GPU run against a CPU run, or a
tensor-parallel run against one rank.

usage: compare_stats.py RUN_A RUN_B [--rtol 1e-3] [--atol 1e-6]
  RUN_*: a run directory (holding debug_stats.jsonl) or the file itself.
Exit code 0 when every common step agrees, 1 at the first divergence, 2 on bad input.
"""
import argparse
import json
import math
import os
import sys


def load(path):
    if os.path.isdir(path):
        path = os.path.join(path, "debug_stats.jsonl")
    rows = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                    rows[(r["step"], r["order"])] = r
                except (ValueError, KeyError) as e:
                    sys.exit(f"error: {path}:{n}: not a statistics line ({e})")
    except OSError as e:
        sys.exit(f"error: {path}: {e.strerror} (run with run.debug_level = 2)")
    if not rows:
        sys.exit(f"error: {path}: no statistics (run with run.debug_level = 2)")
    return path, rows


def differs(a, b, rtol, atol):
    return abs(a - b) > atol + rtol * max(abs(a), abs(b)) or (math.isnan(a) != math.isnan(b))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--atol", type=float, default=1e-6)
    args = ap.parse_args()
    pa, a = load(args.a)
    pb, b = load(args.b)
    common = sorted(set(a) & set(b))
    if not common:
        sys.exit(f"error: {pa} and {pb} share no (step, tensor) statistics")
    for key in common:
        ra, rb = a[key], b[key]
        if ra["tensor"] != rb["tensor"]:
            sys.exit(f"error: step {key[0]} position {key[1]}: {ra['tensor']} vs {rb['tensor']} (different models?)")
        for field in ("count", "nan", "mean", "std", "max_abs"):
            if differs(float(ra[field]), float(rb[field]), args.rtol, args.atol):
                print(f"first divergence: step {key[0]}, {ra['tensor']}: {field} {ra[field]:.6g} vs {rb[field]:.6g}")
                print(f"  {pa}: mean {ra['mean']:.6g} std {ra['std']:.6g} max_abs {ra['max_abs']:.6g} nan {ra['nan']}")
                print(f"  {pb}: mean {rb['mean']:.6g} std {rb['std']:.6g} max_abs {rb['max_abs']:.6g} nan {rb['nan']}")
                return 1
    steps = sorted({k[0] for k in common})
    print(f"no divergence: {len(common)} tensor statistics over step(s) {', '.join(map(str, steps))} agree "
          f"(rtol {args.rtol}, atol {args.atol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
