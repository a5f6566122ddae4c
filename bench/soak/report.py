#!/usr/bin/env python3
"""Markdown tables of one or more soak runs (bench/soak/soak.py --out folders): faults per kind
with recovery times (and, per kind where it applies, the burst's refused / accepted / cancelled
submissions and a partitioned worker's time to rejoin), jobs accounted for, and per service its
longest life (one pid) with the RSS / FD / thread slopes over it, from each run's summary.json.

    bench/soak/report.py /tmp/soak-a /tmp/soak-b"""

import json
import os
import sys


def load(folder):
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt(v, digits=1):
    return "-" if v is None else f"{v:+.{digits}f}" if isinstance(v, float) else str(v)


def report(folder):
    s = load(folder)
    if s is None:
        print(f"## {folder}: no summary (the run did not finish)\n")
        return
    spare = ", trainer rank 0 spared" if s.get("spare_rank0") else ""
    print(f"## {folder}: seed {s['seed']}, {s['minutes']} min, {s['trainers']} trainer(s)"
          f"{spare}, a fault every {s['fault_every_s']} s\n")
    print("| measure | value |\n| --- | --- |")
    print(f"| jobs | {s['jobs']}: {s['jobs_succeeded']} SUCCEEDED; FAILED naming the fault "
          f"{s['jobs_failed_naming_the_fault'] or 0}; cancelled by the soak "
          f"{s.get('jobs_cancelled_by_soak', 0)}; lost {len(s['jobs_lost'])}; unexplained "
          f"{len(s['jobs_unexplained'])}; rows differing {len(s['jobs_rows_differ'])}; bad "
          f"checkpoint folders {len(s['jobs_bad_checkpoints'])} |")
    print(f"| faults injected / recovered | {s['faults_injected']} / {s['faults_recovered']} "
          f"(skipped {s['faults_skipped']}) |")
    print(f"| time to recover p50 / p99 | {s['recover_s_p50']} s / {s['recover_s_p99']} s |")
    if s.get("load1_min_median_max"):
        lo, med, hi = s["load1_min_median_max"]
        print(f"| load average (1 min) min / median / max | {lo:.1f} / {med:.1f} / {hi:.1f} |")
    if s.get("setup"):
        print(f"| network faults | {s['setup'].get('net_worker')} in namespace "
              f"{s['setup'].get('netns')} ({s['setup'].get('ns_ip')}) |")
    if s.get("max_queued_jobs") is not None:
        print(f"| coordinator --max-queued-jobs | {s['max_queued_jobs']} |")
    print("\n| fault | injected | recovered | p50 s | p99 s | handled visibly | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for kind, k in sorted(s["per_kind"].items()):
        seen = k.get("seen")
        notes = []
        if "refused" in k:
            notes.append(f"submissions refused 429 {k['refused']} (counted "
                         f"{k.get('refused_counted', 0):.0f}), accepted {k.get('accepted', 0)}, "
                         f"cancelled {k.get('cancelled', 0)}")
        if "rejoined_s_p50" in k:
            notes.append(f"worker live again after the heal p50 {k['rejoined_s_p50']} s, max "
                         f"{k['rejoined_s_max']} s")
        if k.get("not_recovered_at_s"):
            notes.append(f"not recovered: faults at {k['not_recovered_at_s']} s")
        print(f"| {kind} | {k['injected']} | {k['recovered']} | {k['recover_s_p50']} | "
              f"{k['recover_s_p99']} | {'-' if seen is None else str(seen) + ' of ' + str(k['injected'])} "
              f"| {'; '.join(notes) or '-'} |")
    # Per service its longest life (one pid): minutes from its start, and from the end of the
    # warm-up; RSS over the whole life, and the slopes after the warm-up and over the second
    # half of that life (a leak keeps rising there; warm-up flattens).
    print("\n| service | longest life, min (after warm-up) | restarts | RSS MiB start -> end | "
          "RSS MiB/h | RSS MiB/h, 2nd half | FDs | FDs/h | threads | threads/h |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, v in s["services"].items():
        rss = v.get("rss_mib_life_first_last") or v["rss_mib_first_last"] or ["-", "-"]
        fds = v["fds_first_last"] or ["-", "-"]
        th = v["threads_first_last"] or ["-", "-"]
        life = v.get("longest_life_min", "-")
        print(f"| {name} | {life} ({v['span_min']}) | {v['restarts']} | {rss[0]} -> {rss[1]} | "
              f"{fmt(v['rss_mib_per_hour'])} | {fmt(v.get('rss_mib_per_hour_second_half'))} | "
              f"{fds[0]} -> {fds[1]} | {fmt(v['fds_per_hour'])} | "
              f"{th[0]} -> {th[1]} | {fmt(v['threads_per_hour'])} |")
    print()


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: report.py SOAK_OUT_FOLDER...")
    for folder in sys.argv[1:]:
        report(folder)


if __name__ == "__main__":
    main()
