#!/usr/bin/env python3
"""Unit tests for dashboard_metrics.py: the PromQL name extraction, the contract and scrape
parsers, and that the check fails (naming the metric) when a dashboard uses an unknown metric."""

import io
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_metrics as dm  # noqa: E402

DOC = os.path.join(dm.SOURCE_DIR, "docs", "metrics.md")

SMALL_DOC = """# metrics
Every service exports `fp8rl_build_info{service}` (gauge, always 1).

| name | type | labels | meaning |
|---|---|---|---|
| fp8rl_a_total | counter | kind | a |
| fp8rl_b | gauge | | b |
| fp8rl_c_seconds | histogram | | c |
"""


def dashboard(*exprs, variable_query=None):
    panels = [{"id": 1, "type": "row", "title": "r", "panels": []}]
    for i, e in enumerate(exprs, start=2):
        panels.append({"id": i, "type": "timeseries", "title": f"p{i}",
                       "targets": [{"refId": "A", "expr": e}]})
    templating = {"list": []}
    if variable_query:
        templating["list"].append({"name": "v", "type": "query", "query": variable_query})
    return {"uid": "t", "title": "t", "schemaVersion": 39, "panels": panels,
            "templating": templating}


class PromqlNames(unittest.TestCase):
    def test_aggregation_with_by_before_the_argument(self):
        self.assertEqual(
            dm.promql_metric_names('sum by (kind) (rate(fp8rl_x_total{kind="generated", '
                                   'instance=~"$instance"}[$__rate_interval]))'),
            {"fp8rl_x_total"})

    def test_histogram_quantile_and_by_after_the_argument(self):
        self.assertEqual(dm.promql_metric_names(
            "histogram_quantile(0.95, sum(rate(h_bucket[5m])) by (le))"), {"h_bucket"})

    def test_vector_matching_lists_are_labels(self):
        self.assertEqual(dm.promql_metric_names(
            "sum by (phase) (rate(a[1m])) / ignoring(phase) group_left sum(rate(b[1m]))"),
            {"a", "b"})
        self.assertEqual(dm.promql_metric_names("a * on(job, instance) group_right(x) b"),
                         {"a", "b"})

    def test_strings_and_matchers_hide_fake_names(self):
        self.assertEqual(dm.promql_metric_names('scalar(max(a)) - b{l="sum(c) d}"}'), {"a", "b"})

    def test_keywords_numbers_and_offsets(self):
        self.assertEqual(dm.promql_metric_names("a offset 5m and b > bool 1e-6 or c unless d"),
                         {"a", "b", "c", "d"})

    def test_bare_metric_and_subquery(self):
        self.assertEqual(dm.promql_metric_names("up"), {"up"})
        self.assertEqual(dm.promql_metric_names("max_over_time(rate(a[5m])[1h:1m])"), {"a"})

    def test_unterminated_string_is_an_error(self):
        with self.assertRaises(ValueError):
            dm.promql_metric_names('a{l="x}')

    def test_variable_queries(self):
        self.assertEqual(dm.variable_query_metric_names("label_values(fp8rl_b, instance)"),
                         {"fp8rl_b"})
        self.assertEqual(dm.variable_query_metric_names(
            {"query": 'label_values(fp8rl_b{job="x"}, instance)'}), {"fp8rl_b"})
        self.assertEqual(dm.variable_query_metric_names("label_values(instance)"), set())


class Contract(unittest.TestCase):
    def test_real_doc_has_tables_and_prose_names(self):
        contract = dm.parse_metrics_doc(DOC)
        self.assertEqual(contract["fp8rl_generation_request_seconds"], "histogram")
        self.assertEqual(contract["fp8rl_rl_steps_total"], "counter")
        self.assertIn("fp8rl_build_info", contract)
        self.assertIn("fp8rl_process_start_time_seconds", contract)
        self.assertGreater(len(contract), 40)

    def test_histogram_series_names(self):
        contract = {"h_seconds": "histogram", "s": "summary", "g": "gauge"}
        for ok in ("h_seconds", "h_seconds_bucket", "h_seconds_sum", "s_count", "g"):
            self.assertTrue(dm.exported_name_ok(ok, contract), ok)
        for bad in ("s_bucket", "g_sum", "h_seconds_total", "h"):
            self.assertFalse(dm.exported_name_ok(bad, contract), bad)


class Check(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.doc = self.path("metrics.md", SMALL_DOC)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name, text):
        p = os.path.join(self.tmp.name, name)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
        return p

    def run_check(self, dash, scrapes=()):
        d = self.path("d.json", json.dumps(dash))
        out, err = io.StringIO(), io.StringIO()
        rc = dm.check(self.doc, [d], list(scrapes), out=out, err=err)
        return rc, err.getvalue()

    def test_known_metrics_pass(self):
        rc, err = self.run_check(dashboard(
            "sum by (kind) (rate(fp8rl_a_total[5m]))",
            "histogram_quantile(0.9, sum by (le) (rate(fp8rl_c_seconds_bucket[5m])))",
            "count by (service) (fp8rl_build_info)"))
        self.assertEqual(rc, 0, err)

    def test_unknown_metric_fails_and_is_named(self):
        rc, err = self.run_check(dashboard("fp8rl_b", "rate(fp8rl_nope_total[5m])"))
        self.assertEqual(rc, 1)
        self.assertIn("fp8rl_nope_total", err)
        self.assertIn("p3", err)
        self.assertNotIn("fp8rl_b ", err)

    def test_unknown_metric_in_variable_fails(self):
        rc, err = self.run_check(dashboard("fp8rl_b", variable_query="label_values(nope, i)"))
        self.assertEqual(rc, 1)
        self.assertIn("variable 'v'", err)

    def test_query_without_metric_fails(self):
        rc, err = self.run_check(dashboard("vector(1)"))
        self.assertEqual(rc, 1)
        self.assertIn("names no metric", err)

    def test_scrapes(self):
        dash = dashboard("fp8rl_b", "rate(fp8rl_c_seconds_bucket[1m])", "fp8rl_a_total")
        full = self.path("full.prom", "# HELP fp8rl_b b\n# TYPE fp8rl_b gauge\nfp8rl_b 3.5\n"
                         'fp8rl_c_seconds_bucket{le="+Inf"} 4\nfp8rl_c_seconds_sum 1.5\n'
                         "# TYPE fp8rl_a_total counter\n")
        self.assertEqual(self.run_check(dash, [full])[0], 0)
        partial = self.path("partial.prom", "fp8rl_b{service=\"x\"} 1\n")
        rc, err = self.run_check(dash, [partial])
        self.assertEqual(rc, 1)
        self.assertIn("fp8rl_c_seconds_bucket is in no scrape", err)
        self.assertIn("fp8rl_a_total is in no scrape", err)
        # Several scrapes together cover the dashboard.
        rest = self.path("rest.prom", "fp8rl_c_seconds_bucket{le=\"1\"} 2\nfp8rl_a_total 7\n")
        self.assertEqual(self.run_check(dash, [partial, rest])[0], 0)

    def test_bad_scrape_is_an_input_error(self):
        for i, line in enumerate(("this is {not a sample", "1abc 3", "fp8rl_b three",
                                  'fp8rl_b{l="x} 1')):
            with self.assertRaises(dm.InputError, msg=line):
                dm.parse_scrape(self.path(f"bad{i}.prom", line + "\n"))
        good = self.path("good.prom",
                         'fp8rl_b{l="a}b",m="q\\"x"} +Inf 1700000000\nfp8rl_a_total NaN\n')
        self.assertEqual(dm.parse_scrape(good), {"fp8rl_b", "fp8rl_a_total"})
        self.assertEqual(dm.main(["--metrics-doc", self.doc, "--dashboards",
                                  self.path("d.json", json.dumps(dashboard("fp8rl_b"))),
                                  "--scrape", os.path.join(self.tmp.name, "missing.prom")]), 2)

    def test_invalid_json_is_an_input_error(self):
        broken = self.path("broken.json", "{\"panels\": [")
        self.assertEqual(dm.main(["--metrics-doc", self.doc, "--dashboards", broken]), 2)


if __name__ == "__main__":
    unittest.main()
