#!/usr/bin/env python3
"""Tests tools/python/fp8rl_retry.py's REST side against a scripted HTTP server on loopback:
429 answers are retried after at least their Retry-After, the wait grows with jitter inside its
bounds, a 400 is returned at once, a submission is not repeated after a 503 while a read is, and
the give-up error names the call, the tries and the last answer. (The gRPC side runs against a
real coordinator in tests/system/test_overload.py.)"""

import http.server
import json
import os
import sys
import threading
import unittest

SOURCE_DIR = os.environ.get(
    "FP8RL_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tools", "python"))

import fp8rl_retry  # noqa: E402


class ScriptedServer:
    """Answers each request with the next (status, headers, body) of `script`; records paths."""

    def __init__(self, script):
        self.script = list(script)
        self.seen = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def answer(self):
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                outer.seen.append((self.command, self.path))
                status, headers, body = outer.script.pop(0) if outer.script else (500, {}, {})
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class RestRetryTest(unittest.TestCase):
    def run_script(self, script, method, path, policy=None):
        server = ScriptedServer(script)
        self.addCleanup(server.close)
        sleeps = []
        result = fp8rl_retry.rest(method, server.url + path, body={"x": 1} if method == "POST"
                                  else None, policy=policy, sleep=sleeps.append)
        return result, sleeps, server.seen

    def test_429_is_retried_after_at_least_retry_after(self):
        busy = (429, {"Retry-After": "3"}, {"error": "overloaded: 2 jobs queued"})
        (status, body), sleeps, seen = self.run_script(
            [busy, busy, (201, {}, {"id": "job-1"})], "POST", "/v1/jobs")
        self.assertEqual((status, body), (201, {"id": "job-1"}))
        self.assertEqual(len(seen), 3)
        self.assertEqual(len(sleeps), 2)
        self.assertTrue(all(s >= 3.0 for s in sleeps), sleeps)

    def test_400_is_returned_at_once(self):
        (status, body), sleeps, seen = self.run_script(
            [(400, {}, {"error": "algorithm.steps: must be >= 1"})], "POST", "/v1/jobs")
        self.assertEqual(status, 400)
        self.assertEqual(body["error"], "algorithm.steps: must be >= 1")
        self.assertEqual((sleeps, len(seen)), ([], 1))

    def test_submission_is_not_repeated_after_503_but_a_read_is(self):
        down = (503, {}, {"error": "job store unavailable"})
        (status, _), sleeps, seen = self.run_script([down, (201, {}, {})], "POST", "/v1/jobs")
        self.assertEqual((status, len(seen)), (503, 1))
        (status, _), sleeps, seen = self.run_script([down, (200, {}, {"jobs": []})], "GET",
                                                    "/v1/jobs")
        self.assertEqual((status, len(seen), len(sleeps)), (200, 2, 1))

    def test_gives_up_naming_the_call_tries_and_last_answer(self):
        busy = (429, {}, {"error": "overloaded: 9 job API requests in progress"})
        policy = fp8rl_retry.RetryPolicy(max_tries=4, initial_backoff=0.5, max_backoff=1.0)
        server = ScriptedServer([busy] * 10)
        self.addCleanup(server.close)
        sleeps = []
        with self.assertRaises(fp8rl_retry.RetryGaveUp) as raised:
            fp8rl_retry.rest("GET", server.url + "/v1/jobs", policy=policy, sleep=sleeps.append)
        text = str(raised.exception)
        self.assertIn(f"GET {server.url}/v1/jobs: gave up after 4 tries", text)
        self.assertIn("last answer 429: overloaded: 9 job API requests in progress", text)
        self.assertEqual(len(server.seen), 4)
        # Waits b/2..b for b = 0.5, 1.0, 1.0 (capped).
        for s, b in zip(sleeps, (0.5, 1.0, 1.0)):
            self.assertTrue(b / 2 <= s <= b, (s, b))

    def test_budget_stops_retries(self):
        busy = (429, {"Retry-After": "30"}, {"error": "overloaded"})
        policy = fp8rl_retry.RetryPolicy(budget=10.0)
        server = ScriptedServer([busy] * 3)
        self.addCleanup(server.close)
        with self.assertRaises(fp8rl_retry.RetryGaveUp) as raised:
            fp8rl_retry.rest("GET", server.url + "/v1/jobs", policy=policy, sleep=lambda s: None)
        self.assertEqual(raised.exception.tries, 1)  # a 30 s hint does not fit a 10 s budget


class BackoffTest(unittest.TestCase):
    def test_bounds_growth_and_jitter(self):
        policy = fp8rl_retry.RetryPolicy(initial_backoff=0.25, max_backoff=8.0)
        for retry, b in ((1, 0.25), (2, 0.5), (3, 1.0), (6, 8.0), (12, 8.0)):
            self.assertAlmostEqual(fp8rl_retry.backoff_delay(policy, retry, u=0.0), b / 2)
            self.assertAlmostEqual(fp8rl_retry.backoff_delay(policy, retry, u=1.0), b)
        draws = {round(fp8rl_retry.backoff_delay(policy, 4), 6) for _ in range(50)}
        self.assertGreater(len(draws), 10)  # jittered, not one fixed wait
        self.assertEqual(fp8rl_retry.backoff_delay(policy, 1, hint=5.0, u=0.5), 5.0)


if __name__ == "__main__":
    unittest.main()
