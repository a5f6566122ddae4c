#!/usr/bin/env python3
"""Checks that every metric a Grafana dashboard queries is one the fp8rl services export.

Two sources of truth, either or both:
  * docs/metrics.md (the metrics contract; always checked): every metric selector in every panel
    query and every templating query must name a metric from its tables;
  * --scrape FILE...: Prometheus text-format scrapes of the running services (the integration test
    saves one per /metrics endpoint); every dashboard metric must appear in at least one of them.

    dashboard_metrics.py [--metrics-doc docs/metrics.md] [--dashboards DIR_OR_FILE ...]
                         [--scrape FILE ...] [--list]

Exit status: 0 all names found, 1 some missing (one line per problem on stderr), 2 bad input.
"""

import argparse
import json
import os
import re
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE_DIR = os.environ.get("FP8RL_SOURCE_DIR", _REPO)

# Words that may stand where a metric name could, but are not metrics.
_KEYWORDS = {"bool", "and", "or", "unless", "offset", "inf", "nan", "atan2"}
# Words followed by a parenthesised list of label names, not metric names.
_LABEL_LIST_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)[A-Za-z]*")
# name{labels} value [timestamp]
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)'
                     r"(?:\s+-?[0-9]+)?$")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


class InputError(Exception):
    """A file that cannot be read or parsed (exit status 2)."""


def _skip_quoted(expr, i):
    quote = expr[i]
    i += 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string at offset {i}")


def _skip_block(expr, i, close):
    """Skips a {...} label matcher or [...] range, honouring quoted strings inside."""
    i += 1
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_quoted(expr, i)
            continue
        if c == close:
            return i + 1
        i += 1
    raise ValueError(f"unterminated '{close}'")


def _tokens(expr):
    tokens = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            i = _skip_quoted(expr, i)
            tokens.append(("string", ""))
        elif c == "{":
            i = _skip_block(expr, i, "}")
            tokens.append(("matcher", ""))
        elif c == "[":
            i = _skip_block(expr, i, "]")
        elif c == "$":  # a Grafana variable outside brackets, e.g. $__range_s
            m = re.compile(r"\$\{?[A-Za-z0-9_:.]*\}?").match(expr, i)
            i = m.end()
            tokens.append(("var", m.group(0)))
        elif c.isdigit() or (c == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            i = _NUMBER.match(expr, i).end()
            tokens.append(("number", ""))
        elif c.isalpha() or c in "_:":
            m = _IDENT.match(expr, i)
            i = m.end()
            tokens.append(("ident", m.group(0)))
        elif c in "(),":
            tokens.append((c, c))
            i += 1
        else:
            i += 1
    return tokens


def promql_metric_names(expr):
    """Metric names used as selectors in a PromQL expression (functions, keywords, label names in
    by/without/on/ignoring lists, strings and label matchers are not metric names)."""
    tokens = _tokens(expr)
    names = set()
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        following = tokens[i + 1][0] if i + 1 < len(tokens) else None
        if kind != "ident":
            i += 1
            continue
        lowered = value.lower()
        if lowered in _LABEL_LIST_WORDS and following == "(":
            depth, i = 0, i + 1
            while i < len(tokens):
                depth += {"(": 1, ")": -1}.get(tokens[i][0], 0)
                i += 1
                if depth == 0:
                    break
            continue
        # A function call, or an aggregation written "sum by (l) (...)" / "sum without (l) (...)".
        is_call = following == "(" or (following == "ident" and
                                        tokens[i + 1][1].lower() in ("by", "without"))
        if lowered in _KEYWORDS or lowered in _LABEL_LIST_WORDS or is_call:
            i += 1
            continue
        names.add(value)
        i += 1
    return names


def variable_query_metric_names(query):
    """Metric names in a Grafana Prometheus templating query (label_values / query_result)."""
    if isinstance(query, dict):
        query = query.get("query", "")
    if not isinstance(query, str):
        return set()
    m = re.match(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", query, re.S)
    if m:
        return promql_metric_names(m.group(1))
    m = re.match(r"^\s*query_result\((.*)\)\s*$", query, re.S)
    if m:
        return promql_metric_names(m.group(1))
    return set()


def parse_metrics_doc(path):
    """{name: type} from the tables of docs/metrics.md, plus `fp8rl_...` names given in its prose
    (type 'gauge' unless the text after the name says otherwise)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read metrics doc {path}: {e.strerror}") from e
    metrics = {}
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and re.fullmatch(r"fp8rl_[a-z0-9_]+", cells[0]):
                metrics[cells[0]] = cells[1].lower()
        else:
            for m in re.finditer(r"`(fp8rl_[a-z0-9_]+)(?:\{[^}`]*\})?`(\s*\((\w+))?", line):
                metrics.setdefault(m.group(1), (m.group(3) or "gauge").lower())
    if not metrics:
        raise InputError(f"{path}: no fp8rl_ metric names found in its tables")
    return metrics


def exported_name_ok(name, contract):
    """True if `name` is a contract metric or a series name a contract histogram/summary yields."""
    if name in contract:
        return True
    for base_type, suffixes in _SUFFIXES.items():
        for suffix in suffixes:
            if name.endswith(suffix) and contract.get(name[: -len(suffix)]) == base_type:
                return True
    return False


def load_dashboards(paths):
    """[(file name, dashboard dict)] for JSON files and folders of JSON files."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".json"))
        else:
            files.append(p)
    if not files:
        raise InputError(f"no dashboard JSON files in {', '.join(paths)}")
    out = []
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                out.append((os.path.basename(path), json.load(f)))
        except OSError as e:
            raise InputError(f"cannot read dashboard {path}: {e.strerror}") from e
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: invalid JSON: {e}") from e
    return out


def dashboard_queries(dashboard):
    """Yields (where, metric names) for every panel target and templating query."""
    def panels(items):
        for p in items or []:
            yield p
            yield from panels(p.get("panels"))

    for p in panels(dashboard.get("panels")):
        for t in p.get("targets") or []:
            expr = t.get("expr")
            if expr is None:
                continue
            where = (f"panel '{p.get('title', '?')}' (id {p.get('id', '?')}) "
                     f"query {t.get('refId', '?')}")
            try:
                yield where, promql_metric_names(expr)
            except ValueError as e:
                raise InputError(f"{where}: cannot parse expr {expr!r}: {e}") from e
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            yield f"variable '{v.get('name', '?')}'", variable_query_metric_names(v.get("query"))


def _is_sample_value(text):
    try:
        float(text)  # also accepts +Inf, -Inf and NaN, as the text format does
        return True
    except ValueError:
        return False


def parse_scrape(path):
    """Metric names present in a Prometheus text-format scrape: sample names and the names that
    # HELP / # TYPE lines declare."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read scrape {path}: {e.strerror}") from e
    names = set()
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                names.add(parts[2])
            continue
        m = _SAMPLE.match(line)
        if not m or not _is_sample_value(m.group(2)):
            raise InputError(f"{path}:{n}: not a Prometheus sample line: {line[:80]!r}")
        names.add(m.group(1))
    if not names:
        raise InputError(f"{path}: empty scrape (no samples)")
    return names


def check(doc_path, dashboard_paths, scrape_paths, out=sys.stdout, err=sys.stderr, listing=False):
    contract = parse_metrics_doc(doc_path)
    dashboards = load_dashboards(dashboard_paths)
    scraped = set()
    for s in scrape_paths:
        scraped |= parse_scrape(s)

    used, problems, queries = set(), [], 0
    for file_name, dash in dashboards:
        for where, names in dashboard_queries(dash):
            queries += 1
            if not names and where.startswith("panel"):
                problems.append(f"{file_name}: {where}: names no metric")
            for name in sorted(names):
                used.add(name)
                if not exported_name_ok(name, contract):
                    problems.append(f"{file_name}: {where}: metric {name} is not in {doc_path}")
                if scrape_paths and name not in scraped:
                    problems.append(f"{file_name}: {where}: metric {name} is in no scrape "
                                    f"({len(scrape_paths)} files)")
    for p in problems:
        print(f"dashboard_metrics: {p}", file=err)
    if listing:
        for name in sorted(used):
            print(name, file=out)
    if problems:
        return 1
    where = f"{doc_path}" + (f" and {len(scrape_paths)} scrapes" if scrape_paths else "")
    print(f"dashboard_metrics: OK: {len(dashboards)} dashboards, {queries} queries, "
          f"{len(used)} metric names, all in {where}", file=out)
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description="Checks Grafana dashboard queries against the "
                                     "fp8rl metrics contract and, optionally, live scrapes.")
    parser.add_argument("--metrics-doc", default=os.path.join(SOURCE_DIR, "docs", "metrics.md"))
    parser.add_argument("--dashboards", nargs="+",
                        default=[os.path.join(SOURCE_DIR, "deploy", "grafana", "dashboards")])
    parser.add_argument("--scrape", nargs="+", default=[], metavar="FILE",
                        help="Prometheus text scrapes of the running services")
    parser.add_argument("--list", action="store_true", help="print every metric name used")
    args = parser.parse_args(argv)
    try:
        return check(args.metrics_doc, args.dashboards, args.scrape, listing=args.list)
    except InputError as e:
        print(f"dashboard_metrics: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
