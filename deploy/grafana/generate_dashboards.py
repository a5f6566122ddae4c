#!/usr/bin/env python3
"""Writes the fp8rl Grafana dashboards (deploy/grafana/dashboards/*.json) from one compact source.

The dashboards are defined here as data so that layout, data source and panel boilerplate are
uniform; the JSON files are generated and checked in (tests/deploy checks they are up to date and
that every query names only metrics from docs/metrics.md).

    /usr/bin/python3 deploy/grafana/generate_dashboards.py            # rewrite the JSON files
    /usr/bin/python3 deploy/grafana/generate_dashboards.py --out DIR  # write them elsewhere
"""

import argparse
import json
import os
import sys

DATASOURCE = {"type": "prometheus", "uid": "fp8rl-prometheus"}
SCHEMA_VERSION = 39
GRID_COLUMNS = 24
RATE = "[$__rate_interval]"
WORKERS = 'instance=~"$instance"'


def target(expr, legend="", instant=False):
    return {"expr": expr, "legendFormat": legend, "instant": instant}


def timeseries(title, description, targets, unit="short", width=12, height=8, stack=False,
               log=False, minimum=None, maximum=None):
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 30 if stack else 10,
        "showPoints": "never",
        "spanNulls": True,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    if log:
        custom["scaleDistribution"] = {"type": "log", "log": 10}
    defaults = {"unit": unit, "custom": custom}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "_size": (width, height),
    }


def stat(title, description, targets, unit="short", width=6, height=4, decimals=None):
    defaults = {"unit": unit, "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None}]}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        },
        "_size": (width, height),
    }


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def layout(panels):
    """Assigns ids, refIds, data sources and gridPos (left to right, wrapping at 24 columns)."""
    x = y = line_height = 0
    out = []
    for panel_id, panel in enumerate(panels, start=1):
        width, height = panel.pop("_size")
        if panel["type"] == "row" or x + width > GRID_COLUMNS:
            x, y, line_height = 0, y + line_height, 0
        panel = {"id": panel_id, **panel, "gridPos": {"h": height, "w": width, "x": x, "y": y}}
        if panel["type"] != "row":
            panel["datasource"] = dict(DATASOURCE)
            for i, t in enumerate(panel["targets"]):
                t.update({"datasource": dict(DATASOURCE), "refId": chr(ord("A") + i),
                          "range": not t["instant"]})
        out.append(panel)
        x += width
        line_height = max(line_height, height)
        if panel["type"] == "row":
            x, y, line_height = 0, y + height, 0
    return out


def instance_variable(metric):
    return {
        "name": "instance",
        "label": "worker",
        "type": "query",
        "datasource": dict(DATASOURCE),
        "query": {"query": f"label_values({metric}, instance)", "refId": "instance"},
        "definition": f"label_values({metric}, instance)",
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard(uid, title, description, panels, variables=()):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["fp8rl"],
        "timezone": "",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": list(variables)},
        "links": [{"type": "dashboards", "tags": ["fp8rl"], "asDropdown": False,
                   "title": "fp8rl", "includeVars": False, "keepTime": True}],
        "panels": layout(panels),
    }


def training():
    t = target
    return dashboard("fp8rl-training", "fp8rl / RL training",
                     "GRPO progress: reward, validation accuracy, importance-sampling weights, "
                     "train/generation mismatch and where the step time goes.", [
        row("Progress"),
        stat("RL step", "Current RL step of the running job.", [t("fp8rl_rl_step")]),
        stat("Steps per minute", "RL steps completed per minute.",
             [t(f"sum(rate(fp8rl_rl_steps_total{RATE})) * 60")], decimals=2),
        stat("Running jobs", "Jobs in state RUNNING.",
             [t('sum(fp8rl_coordinator_jobs{state="running"})')]),
        stat("Live workers", "Registered workers with a fresh heartbeat.",
             [t("sum by (kind) (fp8rl_coordinator_live_workers)", "{{kind}}")]),
        timeseries("Reward (mean of the step's samples)", "Mean verifier reward per RL step.",
                   [t("fp8rl_rl_reward_mean", "reward")], unit="none"),
        timeseries("Validation accuracy", "Accuracy on the held-out split (every k steps).",
                   [t("fp8rl_rl_validation_accuracy", "accuracy")], unit="percentunit",
                   minimum=0, maximum=1),
        row("Importance sampling and mismatch"),
        timeseries("IS weights (before truncation)",
                   "w = exp(prev_logprobs - gen_logprobs) over the last step's tokens.",
                   [t("fp8rl_trainer_is_weight", "{{stat}}"),
                    t("fp8rl_rl_sampling_importance_ratio", "sampling_importance_ratio")],
                   unit="none"),
        timeseries("Tokens outside the IS bounds", "is_oob_ratio of the last step.",
                   [t("fp8rl_trainer_is_oob_ratio", "trainer"),
                    t("fp8rl_rl_is_oob_ratio", "coordinator")], unit="percentunit", minimum=0),
        timeseries("token_mult_prob_error", "mean(exp(|gen - prev|)) over valid tokens; 1 = none.",
                   [t("fp8rl_trainer_token_mult_prob_error", "trainer"),
                    t("fp8rl_rl_token_mult_prob_error", "coordinator")], unit="none", width=8),
        timeseries("gen_kl_error", "KL(gen || train) per token.",
                   [t("fp8rl_trainer_gen_kl_error", "trainer"),
                    t("fp8rl_rl_gen_kl_error", "coordinator")], unit="none", width=8),
        timeseries("Probability ratio range", "Min and max of exp(prev - gen) in the last step.",
                   [t("fp8rl_trainer_probs_ratio_min", "min"),
                    t("fp8rl_trainer_probs_ratio_max", "max")], unit="none", log=True, width=8),
        row("Step time"),
        timeseries("RL step phases", "Time of each phase of the last step (coordinator).",
                   [t("fp8rl_rl_step_phase_seconds", "{{phase}}")], unit="s", stack=True),
        timeseries("Trainer phases", "Time of each trainer phase in the last step.",
                   [t("fp8rl_trainer_phase_seconds", "{{phase}}")], unit="s", stack=True),
        timeseries("Share of wall time by phase", "Fraction of RL time spent in each phase.",
                   [t(f"sum by (phase) (rate(fp8rl_rl_phase_seconds_total{RATE})) / ignoring(phase)"
                      f" group_left sum(rate(fp8rl_rl_phase_seconds_total{RATE}))", "{{phase}}")],
                   unit="percentunit", stack=True),
        timeseries("Throughput", "Samples scored and training tokens per second.",
                   [t(f"sum(rate(fp8rl_rl_samples_total{RATE}))", "samples/s"),
                    t(f"sum(rate(fp8rl_trainer_tokens_total{RATE}))", "train tokens/s")],
                   unit="short"),
        timeseries("Sample staleness (asynchronous RL)",
                   "Versions between a trained sample's generating version and the trained one "
                   "(algorithm.max_staleness >= 1; empty for synchronous jobs): mean and p95, and "
                   "samples per second regenerated for being older than the bound.",
                   [t(f"sum(rate(fp8rl_rl_sample_staleness_sum{RATE})) / "
                      f"sum(rate(fp8rl_rl_sample_staleness_count{RATE}))", "mean"),
                    t(f"histogram_quantile(0.95, sum by (le) "
                      f"(rate(fp8rl_rl_sample_staleness_bucket{RATE})))", "p95"),
                    t(f"sum(rate(fp8rl_rl_stale_regenerated_samples_total{RATE}))",
                      "regenerated/s")], unit="none"),
        timeseries("Idle time (asynchronous RL)",
                   "Share of wall time the RL loop waited for a rollout (trainer idle) and the "
                   "rollout producer waited for a version it may use (generation idle).",
                   [t(f"sum(rate(fp8rl_rl_trainer_idle_seconds_total{RATE}))", "trainer idle"),
                    t(f"sum(rate(fp8rl_rl_generation_idle_seconds_total{RATE}))",
                      "generation idle")], unit="percentunit", minimum=0),
        row("Optimizer"),
        timeseries("Loss", "Loss of the last optimizer step.", [t("fp8rl_trainer_loss", "loss")],
                   unit="none", width=8),
        timeseries("Gradient norm", "Before clipping.", [t("fp8rl_trainer_grad_norm", "grad norm")],
                   unit="none", width=8),
        timeseries("Learning rate", "Current learning rate.",
                   [t("fp8rl_trainer_learning_rate", "lr")], unit="none", width=8),
        row("Trainer group (trainer.data_parallel)"),
        timeseries("Group size and rank, per trainer",
                   "Trainers in each trainer's data-parallel group and its rank (size 1, rank 0 "
                   "when alone); one line per scraped trainer.",
                   [t("fp8rl_trainer_group_size", "size {{instance}}"),
                    t("fp8rl_trainer_group_rank", "rank {{instance}}")], unit="none", width=8),
        timeseries("All-reduce time per trainer",
                   "Time in the last step's all-reduces, and the part of it the step waited for "
                   "after the backward (all of the gradient all-reduce without buckets; what the "
                   "backward did not hide with --allreduce-bucket-mb).",
                   [t("fp8rl_trainer_all_reduce_seconds", "all-reduce {{instance}}"),
                    t("fp8rl_trainer_all_reduce_wait_seconds", "waited {{instance}}")],
                   unit="s", width=8),
        timeseries("All-reduce bytes per trainer",
                   "Payload bytes per second each trainer hands to all-reduce (fp32 gradients, "
                   "loss statistics, gathered logprobs and KV records; not wire bytes).",
                   [t(f"rate(fp8rl_trainer_all_reduce_bytes_total{RATE})", "{{instance}}")],
                   unit="Bps", width=8),
        row("Jobs and services"),
        timeseries("Jobs by state", "Jobs in the coordinator's store.",
                   [t("sum by (state) (fp8rl_coordinator_jobs)", "{{state}}")], width=8),
        timeseries("Rejected requests and recoveries",
                   "Invalid requests per second (400 / INVALID_ARGUMENT), generation calls "
                   "re-dispatched and jobs resumed from a checkpoint.",
                   [t(f"sum by (api) (rate(fp8rl_coordinator_requests_rejected_total{RATE}))",
                      "{{api}}"),
                    t(f"sum(rate(fp8rl_rl_redispatched_requests_total{RATE}))", "re-dispatched"),
                    t(f"sum(rate(fp8rl_coordinator_job_resumes_total{RATE}))", "job resumes")],
                   unit="reqps", width=8),
        timeseries("Services up", "Processes exporting fp8rl_build_info, by service.",
                   [t("count by (service) (fp8rl_build_info)", "{{service}}")], width=8),
    ])


def generation():
    t = target
    sel = "{" + WORKERS + "}"
    return dashboard("fp8rl-generation", "fp8rl / Generation",
                     "Generation workers: throughput, queueing, batching, KV cache and how far "
                     "each worker's weights lag behind the newest version.", [
        row("Throughput"),
        timeseries("Tokens per second", "Prompt and generated tokens, all selected workers.",
                   [t(f"sum by (kind) (rate(fp8rl_generation_tokens_total{sel}{RATE}))",
                      "{{kind}}")], unit="short"),
        timeseries("Generated tokens per second by worker", "",
                   [t(f'sum by (instance) (rate(fp8rl_generation_tokens_total{{kind="generated",'
                      f'{WORKERS}}}{RATE}))', "{{instance}}")], unit="short"),
        timeseries("Requests per second", "Sampling requests finished, by status.",
                   [t(f"sum by (status) (rate(fp8rl_generation_requests_total{sel}{RATE}))",
                      "{{status}}")], unit="reqps"),
        timeseries("Request latency", "Time from request to last token.",
                   [t(f"histogram_quantile({q}, sum by (le) "
                      f"(rate(fp8rl_generation_request_seconds_bucket{sel}{RATE})))", f"p{p}")
                    for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))] +
                   [t(f"sum(rate(fp8rl_generation_request_seconds_sum{sel}{RATE})) / "
                      f"sum(rate(fp8rl_generation_request_seconds_count{sel}{RATE}))", "mean")],
                   unit="s"),
        row("Batching and KV cache"),
        timeseries("Queue depth", "Sequences waiting to join a batch.",
                   [t(f"fp8rl_generation_queue_depth{sel}", "{{instance}}")], width=6),
        timeseries("Decode batch size", "Sequences in the current decode batch.",
                   [t(f"fp8rl_generation_batch_size{sel}", "{{instance}}")], width=6),
        timeseries("KV-cache use", "Used / reserved KV-cache slots.",
                   [t(f"fp8rl_generation_kv_cache_usage_ratio{sel}", "{{instance}}")],
                   unit="percentunit", minimum=0, maximum=1, width=6),
        timeseries("KV-cache memory", "Bytes held by the KV cache (FP8 halves it vs BF16).",
                   [t(f"fp8rl_generation_kv_cache_bytes{sel}", "{{instance}}")], unit="bytes",
                   width=6),
        row("Weights"),
        timeseries("Weight-version lag", "Newest complete version in weight sync minus the "
                   "version each worker uses (0 = up to date).",
                   [t(f"scalar(max(fp8rl_weight_sync_latest_version)) - "
                      f"fp8rl_generation_weight_version{sel}", "{{instance}}")], unit="none",
                   minimum=0, width=8),
        timeseries("Weight version per worker", "Weight version in use.",
                   [t(f"fp8rl_generation_weight_version{sel}", "{{instance}}")], unit="none",
                   width=8),
        timeseries("Weight swaps", "Versions swapped in per minute.",
                   [t(f"sum by (instance) (rate(fp8rl_generation_weight_swaps_total{sel}{RATE}))"
                      " * 60", "{{instance}}")], unit="none", width=8),
        timeseries("Weight installs", "Versions installed per minute: in place into the idle "
                   "slot's model, or into a rebuilt one; deltas received and delta fallbacks.",
                   [t(f"sum by (mode) (rate(fp8rl_generation_weight_installs_total{sel}{RATE}))"
                      " * 60", "{{mode}}"),
                    t(f"sum(rate(fp8rl_generation_weight_delta_versions_total{sel}{RATE})) * 60",
                      "from delta"),
                    t(f"sum(rate(fp8rl_generation_weight_delta_fallbacks_total{sel}{RATE})) * 60",
                      "delta fallback")], unit="none", width=8),
        timeseries("Weight install and delta decode time", "Mean seconds to install a verified "
                   "version into a model and to rebuild a version from its delta.",
                   [t(f"sum(rate(fp8rl_generation_weight_install_seconds_sum{sel}{RATE})) / "
                      f"sum(rate(fp8rl_generation_weight_install_seconds_count{sel}{RATE}))",
                      "install"),
                    t(f"sum(rate(fp8rl_generation_weight_delta_decode_seconds_sum{sel}{RATE})) / "
                      f"sum(rate(fp8rl_generation_weight_delta_decode_seconds_count{sel}{RATE}))",
                      "delta decode")], unit="s", width=8),
        timeseries("Weight receive buffers", "Bytes mapped for each worker's two receive buffers.",
                   [t(f"fp8rl_generation_weight_receive_buffer_bytes{sel}", "{{instance}}")],
                   unit="bytes", width=8),
    ], variables=[instance_variable("fp8rl_generation_weight_version")])


def weight_sync():
    t = target
    return dashboard("fp8rl-weight-sync", "fp8rl / Weight sync",
                     "Versioned weight store: push latency, bandwidth, which worker holds which "
                     "version, and rejected (corrupt or incomplete) uploads.", [
        row("Versions"),
        stat("Latest version", "Newest complete version.",
             [t("max(fp8rl_weight_sync_latest_version)")]),
        stat("Subscribers", "Connected generation workers.",
             [t("sum(fp8rl_weight_sync_subscribers)")]),
        stat("Rejected uploads (range)", "Uploads rejected as corrupt or incomplete.",
             [t('sum(increase(fp8rl_weight_sync_uploads_total{result="rejected"}[$__range]))',
                instant=True)]),
        stat("Latest payload", "Payload size of the latest version.",
             [t("sum(fp8rl_weight_sync_version_bytes)")], unit="bytes"),
        timeseries("Version acknowledged per worker", "Version each worker acknowledged.",
                   [t("fp8rl_weight_sync_worker_version", "{{worker}}")], unit="none"),
        timeseries("Lag per worker", "Latest version minus the version each worker acknowledged.",
                   [t("scalar(max(fp8rl_weight_sync_latest_version)) - "
                      "fp8rl_weight_sync_worker_version", "{{worker}}")], unit="none", minimum=0),
        row("Transfer"),
        timeseries("Push latency", "From a version's arrival to the last worker's ack.",
                   [t(f"histogram_quantile({q}, sum by (le) "
                      f"(rate(fp8rl_weight_sync_push_seconds_bucket{RATE})))", f"p{p}")
                    for q, p in ((0.5, 50), (0.95, 95), (0.99, 99))] +
                   [t(f"sum(rate(fp8rl_weight_sync_push_seconds_sum{RATE})) / "
                      f"sum(rate(fp8rl_weight_sync_push_seconds_count{RATE}))", "mean")],
                   unit="s"),
        timeseries("Bandwidth", "Payload bytes per second in from the trainer and out to workers.",
                   [t(f"sum(rate(fp8rl_weight_sync_received_bytes_total{RATE}))", "received"),
                    t(f"sum(rate(fp8rl_weight_sync_sent_bytes_total{RATE}))", "sent")],
                   unit="Bps"),
        timeseries("Uploads", "Uploads per minute by result.",
                   [t(f"sum by (result) (rate(fp8rl_weight_sync_uploads_total{RATE})) * 60",
                      "{{result}}")], unit="none"),
        timeseries("Payload size by format", "FP8: 1 byte per parameter plus scales.",
                   [t("fp8rl_weight_sync_version_bytes", "{{format}}")], unit="bytes"),
        timeseries("Bytes per version: full vs delta",
                   "Bytes on the wire for the latest version (full payload, or its delta "
                   "against the previous version), and the mean payload per push by kind.",
                   [t("fp8rl_weight_sync_version_wire_bytes", "latest {{kind}}"),
                    t(f"sum by (kind) (rate(fp8rl_weight_sync_pushed_bytes_total{RATE})) / "
                      f"sum by (kind) (rate(fp8rl_weight_sync_pushes_total{RATE}))",
                      "per push {{kind}}")], unit="bytes"),
        timeseries("Delta compression", "Full bytes / delta bytes of the latest version's delta, "
                   "and pushes per minute by kind (full, delta).",
                   [t("fp8rl_weight_sync_delta_compression_ratio", "full / delta"),
                    t(f"sum by (kind) (rate(fp8rl_weight_sync_pushes_total{RATE})) * 60",
                      "pushes/min {{kind}}")], unit="none"),
    ])


def fp8():
    t = target
    return dashboard("fp8rl-fp8", "fp8rl / FP8",
                     "FP8 recipe health: 128x128 weight block scales and KV-cache scales of each "
                     "publish, recalibration cost, and the mismatch FP8 leaves.", [
        row("Scales"),
        timeseries("Weight block scale_inv", "min / mean / max of the 128x128 block scales "
                   "(amax / 448) at the last publish.",
                   [t("fp8rl_trainer_weight_scale_inv", "{{stat}}")], unit="none", log=True),
        timeseries("KV-cache scales", "Per-layer k_scale / v_scale statistics at the last publish.",
                   [t("fp8rl_trainer_kv_scale", "{{tensor}} {{stat}}")], unit="none", log=True),
        timeseries("Weight scale spread", "max / min block scale: dynamic range the blocks cover.",
                   [t('max(fp8rl_trainer_weight_scale_inv{stat="max"}) / '
                      'min(fp8rl_trainer_weight_scale_inv{stat="min"})', "max/min")],
                   unit="none", log=True),
        timeseries("Policy version", "Last published weight version.",
                   [t("fp8rl_trainer_policy_version", "trainer"),
                    t("max(fp8rl_weight_sync_latest_version)", "weight sync")], unit="none"),
        row("Recalibration"),
        timeseries("Recalibration time", "Re-quantization + KV calibration of the last publish.",
                   [t("fp8rl_trainer_recalibration_seconds", "recalibration")], unit="s"),
        timeseries("Quantize / calibrate / publish", "Trainer phases of the last step.",
                   [t('fp8rl_trainer_phase_seconds{phase=~"quantize|calibrate|publish"}',
                      "{{phase}}")], unit="s", stack=True),
        row("Mismatch left by FP8"),
        timeseries("token_mult_prob_error", "1 = sampler and learner agree exactly.",
                   [t("fp8rl_trainer_token_mult_prob_error", "token_mult_prob_error")],
                   unit="none", width=8),
        timeseries("gen_kl_error", "KL(gen || train) per token.",
                   [t("fp8rl_trainer_gen_kl_error", "gen_kl_error")], unit="none", width=8),
        timeseries("KV-cache memory per worker", "Bytes held by the (FP8 or BF16) KV cache.",
                   [t("fp8rl_generation_kv_cache_bytes", "{{instance}}")], unit="bytes", width=8),
    ])


DASHBOARDS = {
    "fp8rl-training.json": training,
    "fp8rl-generation.json": generation,
    "fp8rl-weight-sync.json": weight_sync,
    "fp8rl-fp8.json": fp8,
}


def render(build):
    return json.dumps(build(), indent=2) + "\n"


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "dashboards"),
                        help="folder for the JSON files (default: deploy/grafana/dashboards)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for name, build in DASHBOARDS.items():
        path = os.path.join(args.out, name)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(render(build))
        os.replace(tmp, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
