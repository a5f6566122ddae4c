#!/usr/bin/env python3
"""Projects weight-sync time ("publish -> all N workers hold version v") to 8B / 30B FP8 versions,
16 and 64 workers, 100 and 400 Gbit/s, for --fanout direct, chain and tree:K, from per-hop costs
measured on this machine (fp8rl-bench-weight-sync-fanout, fp8rl-bench-weight-install) and a link
model. Prints a markdown table. These are projections from a model, not measurements; the model
and its inputs are in docs/design/weight-sync-fanout.md and
docs/results/weight-sync-fanout-2026-12-04.md.

The model, per version of S GB (one NIC of B GB/s per host, full duplex, every host in one
non-blocking switch; chunk c GB; p cores per relay stream):
  r      = min(B, p / c_hop)                      a hop's pipelined rate (link or CPU bound)
  direct = S / min(B, p / c_up) + N * S / min(B, P_root / c_hop) + S * c_inst
           (weight sync's NIC carries N copies; upload overlapped only in part, so counted once)
  chain  = S / r + N * (c / r + rtt) + S * c_inst
           (cut-through: every hop forwards chunk i while receiving chunk i + 1)
  tree:K = K * S / r + depth * K * (c / r + rtt) + S * c_inst,  depth = ceil(log_K(N (K-1) + 1))
A delta of fraction f sends f * S per copy and adds encoding (once, one zstd thread) and decoding
(on every worker) of the full version: c_enc * S + c_dec * S. The relay as built forwards full
versions only (deltas reach the first hop), so the delta rows for chain / tree describe a relay
that forwards the delta frames as they arrive, which is not built, and the table says so.
"""
import argparse
import math
import sys

# Calibration: CPU-seconds per GB of version, measured on a 2-core Debian 12 VM under load.
# c_up, c_hop: fp8rl-bench-weight-sync-fanout (docs/results/weight-sync-fanout-2026-12-04.md).
# c_inst: fp8rl-bench-weight-install, llama-100m, in-place install from the third version on
# (0.19-0.20 CPU-s per 124.7 MB, docs/perf.md "Installing a weight version", 2026-12-02).
# c_enc / c_dec: fp8rl-bench-weight-sync-delta, llama-100m at lr 1e-4 (encode 0.75-1.4 s,
# decode 0.34-0.53 s per 124.7 MB; upper ends used; docs/perf.md "Delta versions", 2026-12-02).
# delta_fraction: the same table, full / delta 3.8-4.4 at lr 1e-4 (a quarter).
CALIBRATION = {
    "c_up": None,  # filled from --c-up (required: the bench's "upload only" cpu_s_per_gb)
    "c_hop": None,  # filled from --c-hop (the bench's chain hop_cpu_s_per_gb)
    "c_inst": 0.20 / 0.1247,
    "c_enc": 1.4 / 0.1247,
    "c_dec": 0.53 / 0.1247,
    "delta_fraction": 0.25,
}

# Version sizes in GB (FP8 E4M3 codes + 128x128 F32 scales + BF16 embeddings/norms), as estimated
# in issue 31 for 8B (8.5 GB) and from 30.5B parameters at ~1.02 bytes each for Qwen3-30B-A3B.
MODELS = {"8B": 8.5, "30B": 31.0}

# Published refit times for comparison (as cited in issue 31; not re-measured here).
PUBLISHED = [
    ("NeMo RL, Qwen3-30B FP8 refit (NCCL broadcast / CUDA IPC), as cited in issue 31", "2.9-4.0 s"),
    ("NeMo RL PR #2413 (NCCL transfer refit, closed unmerged), 30B Megatron -> vLLM "
     "(https://github.com/NVIDIA-NeMo/RL/pull/2413)", "0.48-0.67 s"),
    ("verl, 7B co-located (CUDA IPC), as cited in issue 31", "tens of ms"),
]


def hop_rate(bw, cores, cost):
    return min(bw, cores / cost)


def project(mode, k, n, size, bw, cal, cores, root_cores, chunk, rtt, delta):
    """Seconds until all n workers hold a version of `size` GB."""
    c_hop, c_up, c_inst = cal["c_hop"], cal["c_up"], cal["c_inst"]
    wire = size * (cal["delta_fraction"] if delta else 1.0)
    codec = (cal["c_enc"] + cal["c_dec"]) * size if delta else 0.0
    install = size * c_inst
    if mode == "direct":
        up = size / hop_rate(bw, cores, c_up)
        return up + n * wire / hop_rate(bw, root_cores, c_hop) + codec + install
    r = hop_rate(bw, cores, c_hop)
    if mode == "chain":
        k, depth = 1, n
    else:
        depth = math.ceil(math.log(n * (k - 1) + 1, k)) if k > 1 else n
    return k * wire / r + depth * k * (chunk / r + rtt) + codec + install


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--c-up", type=float, required=True, help="upload CPU-s per GB (measured)")
    ap.add_argument("--c-hop", type=float, required=True, help="relay hop CPU-s per GB (measured)")
    ap.add_argument("--c-inst", type=float, default=CALIBRATION["c_inst"])
    ap.add_argument("--cores", type=float, default=2, help="cores per relay stream (p)")
    ap.add_argument("--root-cores", type=float, default=16, help="weight-sync host cores")
    ap.add_argument("--chunk-mib", type=float, default=4)
    ap.add_argument("--rtt-us", type=float, default=50)
    ap.add_argument("--tree-k", type=int, default=2)
    args = ap.parse_args(argv)
    for name in ("c_up", "c_hop", "c_inst", "cores", "root_cores", "chunk_mib"):
        if getattr(args, name) <= 0:
            print(f"project.py: --{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    if args.tree_k < 2:
        print("project.py: --tree-k must be >= 2 (tree:1 is the chain)", file=sys.stderr)
        return 2
    cal = dict(CALIBRATION, c_up=args.c_up, c_hop=args.c_hop, c_inst=args.c_inst)
    chunk = args.chunk_mib * 2**20 / 1e9
    rtt = args.rtt_us * 1e-6
    k = args.tree_k
    print(f"Projection (not a measurement): c_up {cal['c_up']:.3f}, c_hop {cal['c_hop']:.3f}, "
          f"c_inst {cal['c_inst']:.3f}, c_enc {cal['c_enc']:.2f}, c_dec {cal['c_dec']:.2f} "
          f"CPU-s/GB; p = {args.cores:g} cores per stream, {args.root_cores:g} on the weight-sync "
          f"host; chunk {args.chunk_mib:g} MiB; rtt {args.rtt_us:g} us; delta = "
          f"{cal['delta_fraction']:.2f} of full.\n")
    print(f"| model | version | workers | link | direct s | chain s | tree:{k} s |")
    print("|---|---|---|---|---|---|---|")
    for model, size in MODELS.items():
        for delta in (False, True):
            for n in (16, 64):
                for gbit in (100, 400):
                    bw = gbit / 8.0
                    row = [project(m, k, n, size, bw, cal, args.cores, args.root_cores, chunk, rtt,
                                   delta) for m in ("direct", "chain", "tree")]
                    kind = f"delta ({cal['delta_fraction']:.2f})*" if delta else "full"
                    print(f"| {model} ({size:g} GB) | {kind} | {n} | {gbit} Gbit/s | "
                          + " | ".join(f"{t:.1f}" for t in row) + " |")
    print("\n* delta rows for chain / tree assume relays that forward the delta frames as they "
          "arrive, which is not built: relays as built forward full versions (the full rows).")
    print("\nPublished, for comparison (not re-measured here):")
    for name, value in PUBLISHED:
        print(f"- {name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
