"""Retries for Python clients of the fp8rl job API (REST or gRPC stubs generated from
proto/fp8rl/v1, see docs/clients.md): a call the coordinator refused for load (HTTP 429 /
RESOURCE_EXHAUSTED, beyond its --max-inflight-requests or --max-queued-jobs) or could not take
(HTTP 503 / UNAVAILABLE) is tried again after a jittered, exponentially growing wait that is never
shorter than the server's hint (Retry-After / grpc-retry-pushback-ms), until a try limit or a time
budget is reached; then RetryGaveUp says what was tried and the last answer.

A job submission (POST /v1/jobs, SubmitJob) is retried on 429 / RESOURCE_EXHAUSTED only: the
coordinator refuses those before storing anything, while after a 503 / UNAVAILABLE it may have
stored the job, and the API has no request id to make a second submission harmless.

    import fp8rl_retry
    status, body = fp8rl_retry.rest("POST", url + "/v1/jobs", job_json)        # (201, {...})
    job = fp8rl_retry.grpc_call(stub.SubmitJob, pb.SubmitJobRequest(config=text),
                                idempotent=False, timeout=30).job

Standard library only; grpc is imported when grpc_call runs.
"""

import dataclasses
import json
import random
import time
import urllib.error
import urllib.request


@dataclasses.dataclass
class RetryPolicy:
    max_tries: int = 8               # for 429 / RESOURCE_EXHAUSTED, the first try included
    max_unavailable_tries: int = 3   # for 503 / UNAVAILABLE (idempotent calls only)
    initial_backoff: float = 0.25    # seconds
    max_backoff: float = 8.0
    budget: float = 60.0             # no retry starts after this many seconds in the call


class RetryGaveUp(Exception):
    """The call was refused on every try. `status` is the last HTTP status (REST) or
    grpc.StatusCode (gRPC), `tries` the number of tries, `message` the last error text."""

    def __init__(self, what, status, tries, seconds, message):
        self.status, self.tries, self.message = status, tries, message
        super().__init__(f"{what}: gave up after {tries} tries in {seconds:.1f} s; "
                         f"last answer {status}: {message}")


def backoff_delay(policy, retry, hint=None, u=None):
    """Seconds to wait before retry number `retry` (1 = the second try): uniform in [b/2, b]
    with b = min(initial_backoff * 2**(retry-1), max_backoff), and at least `hint`."""
    u = random.random() if u is None else u
    b = min(policy.initial_backoff * 2 ** (retry - 1), policy.max_backoff)
    delay = b / 2 + u * b / 2
    return max(delay, hint) if hint is not None else delay


def _retry_loop(what, policy, attempt, sleep):
    """Runs attempt() -> (done, result, kind, status, hint, message) until done or out of
    tries; kind is "overloaded" or "unavailable"."""
    start = time.monotonic()
    tries = 0
    while True:
        tries += 1
        done, result, kind, status, hint, message = attempt()
        if done:
            return result
        limit = policy.max_tries if kind == "overloaded" else policy.max_unavailable_tries
        delay = backoff_delay(policy, tries, hint)
        elapsed = time.monotonic() - start
        if tries >= limit or elapsed + delay > policy.budget:
            raise RetryGaveUp(what, status, tries, elapsed, message)
        sleep(delay)


def _retry_after_seconds(value):
    """Retry-After as seconds (the delta-seconds form); None when absent or an HTTP date."""
    try:
        return max(0.0, float(int(value)))
    except (TypeError, ValueError):
        return None


def rest(method, url, body=None, headers=None, timeout=30, policy=None, sleep=time.sleep):
    """One REST call with retries. `body`: bytes, str or a JSON-serialisable object. Returns
    (status, parsed JSON body or None) for every answer that is not retried (2xx and 4xx other
    than 429 included); raises RetryGaveUp when the retries run out."""
    policy = policy or RetryPolicy()
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    all_headers = {"Content-Type": "application/json"} if data is not None else {}
    all_headers.update(headers or {})
    # A submission may have been stored before a 503; reads and cancels are safe to repeat.
    idempotent = not (method == "POST" and url.rstrip("/").endswith("/v1/jobs"))

    def attempt():
        request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, text, hint = response.status, response.read().decode(), None
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode(errors="replace")
            hint = _retry_after_seconds(e.headers.get("Retry-After"))
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = None
        message = parsed.get("error", text) if isinstance(parsed, dict) else text
        if status == 429:
            return False, None, "overloaded", status, hint, message
        if status == 503 and idempotent:
            return False, None, "unavailable", status, hint, message
        return True, (status, parsed), None, status, None, message

    return _retry_loop(f"{method} {url}", policy, attempt, sleep)


def grpc_call(method, request, idempotent, policy=None, sleep=time.sleep, **kwargs):
    """stub.Method(request, **kwargs) with retries on RESOURCE_EXHAUSTED (and UNAVAILABLE when
    `idempotent`); other errors are raised as grpc.RpcError at once. Raises RetryGaveUp when the
    retries run out."""
    import grpc
    policy = policy or RetryPolicy()

    def attempt():
        try:
            return True, method(request, **kwargs), None, None, None, None
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                kind = "overloaded"
            elif code == grpc.StatusCode.UNAVAILABLE and idempotent:
                kind = "unavailable"
            else:
                raise
            hint = None
            for key, value in e.trailing_metadata() or ():
                if key == "grpc-retry-pushback-ms":
                    try:
                        hint = max(0, int(value)) / 1000.0
                    except ValueError:
                        pass
            return False, None, kind, code.name, hint, e.details()

    what = getattr(method, "_method", None)
    what = what.decode() if isinstance(what, bytes) else (what or "gRPC call")
    return _retry_loop(what, policy, attempt, sleep)
