"""The console's chart list without a running coordinator: charts.json with its step_metrics entry
replaced by the charts of the step-metric schema, as services/coordinator/console/chart_list.cc
does. The schema is read from rl/step_metric_schema.h itself (kStepCharts, then each kStepMetrics
entry's .name / .chart / .chart_label), so there is no second copy to keep in sync; a test with a
coordinator at hand should fetch /console/charts.json instead."""

import json
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _schema_charts(header_text):
    charts_block = header_text.split("kStepCharts", 1)[1].split("}};", 1)[0]
    charts = [{"id": i, "title": t, "series": []}
              for i, t in re.findall(r'\{"([^"]+)",\s*"([^"]+)"\}', charts_block)]
    metrics_block = header_text.split("kStepMetrics =", 1)[1].split("}};", 1)[0]
    by_id = {c["id"]: c for c in charts}
    for entry in metrics_block.split("{.name")[1:]:
        name = re.match(r'\s*=\s*"([^"]+)"', entry).group(1)
        chart = re.search(r'\.chart\s*=\s*"([^"]*)"', entry)
        label = re.search(r'\.chart_label\s*=\s*"([^"]*)"', entry)
        if chart and chart.group(1):
            by_id[chart.group(1)]["series"].append({"key": name, "label": label.group(1)})
    return [c for c in charts if c["series"]]


def chart_list(root=ROOT):
    """The chart list as a dict {"charts": [...], "palette": [...], ...}."""
    with open(os.path.join(root, "services", "coordinator", "console", "charts.json")) as f:
        spec = json.load(f)
    with open(os.path.join(root, "rl", "step_metric_schema.h")) as f:
        schema = _schema_charts(f.read())
    charts = []
    for chart in spec["charts"]:
        charts.extend(schema if chart.get("step_metrics") else [chart])
    spec["charts"] = charts
    return spec
