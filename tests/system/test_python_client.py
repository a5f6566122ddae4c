#!/usr/bin/env python3
"""System test: a gRPC client in another language (Python), generated at test time from
proto/fp8rl/v1/*.proto alone (plus the standard health and reflection protos in
tests/system/protos/), drives a real `fp8rl up` cluster: health and reflection, SubmitJob with
the smoke config as YAML text, WatchJob to SUCCEEDED, GetJob, GetJobMetrics, ListJobs, CancelJob
of a queued and of a running job, bad input answered with the right status codes naming the field, and the
server still serving afterwards. Nothing here imports fp8rl code or talks REST."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import yaml

import system_util as su

PROTO_DIR = os.path.join(su.SOURCE_DIR, "proto")
STD_PROTO_DIR = os.path.join(su.SOURCE_DIR, "tests", "system", "protos")
STEPS = 3
TERMINAL = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
# Every step of a job's life comes after the ones before it in this order.
STATE_ORDER = {"JOB_STATE_QUEUED": 0, "JOB_STATE_RUNNING": 1, "JOB_STATE_SUCCEEDED": 2,
               "JOB_STATE_FAILED": 2, "JOB_STATE_CANCELLED": 2}


def import_grpc_or_skip():
    try:
        import grpc  # noqa: F401
        import google.protobuf  # noqa: F401
    except ImportError as e:
        print(f"SKIP: Python gRPC modules missing ({e}); install python3-grpcio python3-protobuf",
              flush=True)
        sys.exit(su.SKIP)


def generate(out_dir):
    """Python modules for the fp8rl protos and the standard ones, with grpc_tools.protoc when it
    is importable (and FP8RL_PY_GENERATOR is not "protoc"), else protoc + grpc_python_plugin.
    Returns the generator used."""
    fp8rl_protos = sorted(glob.glob(os.path.join(PROTO_DIR, "fp8rl", "v1", "*.proto")))
    std_protos = [os.path.join(STD_PROTO_DIR, p) for p in ("health.proto", "reflection.proto")]
    su.check(fp8rl_protos, f"no .proto files under {PROTO_DIR}/fp8rl/v1")
    runs = [(PROTO_DIR, fp8rl_protos), (STD_PROTO_DIR, std_protos)]
    try:
        if os.environ.get("FP8RL_PY_GENERATOR") == "protoc":  # exercise the fallback
            raise ImportError("FP8RL_PY_GENERATOR=protoc")
        import grpc_tools  # noqa: F401
        base = [sys.executable, "-m", "grpc_tools.protoc"]
        generator = "grpc_tools.protoc"
        plugin = []
    except ImportError:
        protoc, plugin_path = shutil.which("protoc"), shutil.which("grpc_python_plugin")
        if protoc is None or plugin_path is None:
            print("SKIP: no Python gRPC code generator (python3-grpc-tools, or protobuf-compiler "
                  "+ protobuf-compiler-grpc)", flush=True)
            sys.exit(su.SKIP)
        base = [protoc]
        generator = "protoc + grpc_python_plugin"
        plugin = [f"--plugin=protoc-gen-grpc_python={plugin_path}"]
    for include, files in runs:
        args = base + plugin + [f"-I{include}", f"--python_out={out_dir}",
                                f"--grpc_python_out={out_dir}"] + files
        p = subprocess.run(args, capture_output=True, text=True)
        su.check(p.returncode == 0, f"{' '.join(args)} failed:\n{p.stdout}{p.stderr}")
    return generator


def expect_rpc_error(call, code, needle, what):
    import grpc
    try:
        reply = call()
    except grpc.RpcError as e:
        su.log(f"  {what}: {e.code().name} {e.details()!r}")
        su.check(e.code() == code, f"{what}: expected {code.name}, got {e.code().name}: "
                                   f"{e.details()}")
        su.check(needle in e.details(), f"{what}: message does not name {needle!r}: {e.details()}")
        return
    su.fail(f"{what}: expected {code.name}, got a reply: {str(reply)[:200]}")


def watch(jobs, pb, state_name, job_id, timeout, on_event=None):
    """Every WatchJob event of a job until the server ends the stream, as (state name, step,
    Job); checks that states and steps only move forward and that the last state is terminal."""
    events = []
    for event in jobs.WatchJob(pb.WatchJobRequest(id=job_id), timeout=timeout):
        job = event.job
        state = state_name(job.state)
        events.append((state, job.step, job))
        su.log(f"  event: {job.id} {state} step {job.step}/{job.total_steps}")
        if on_event is not None:
            on_event(job)
    su.check(events, f"WatchJob {job_id}: no events")
    for (s0, step0, _), (s1, step1, _) in zip(events, events[1:]):
        su.check(step1 >= step0, f"WatchJob {job_id}: step went back {step0} -> {step1}")
        su.check(STATE_ORDER[s1] >= STATE_ORDER[s0], f"WatchJob {job_id}: state {s0} -> {s1}")
    su.check(events[-1][0] in TERMINAL, f"WatchJob {job_id} ended in {events[-1][0]}")
    su.check(all(e[0] not in TERMINAL for e in events[:-1]),
             f"WatchJob {job_id}: events after a terminal state")
    return events


def body(clusters):
    su.require_binaries()
    import_grpc_or_skip()
    import grpc

    gen_dir = tempfile.mkdtemp(prefix="fp8rl-pyclient-")
    start = time.time()
    generator = generate(gen_dir)
    sys.path.insert(0, gen_dir)
    from fp8rl.v1 import common_pb2, job_service_pb2 as pb, job_service_pb2_grpc
    import health_pb2
    import health_pb2_grpc
    import reflection_pb2
    import reflection_pb2_grpc
    su.log(f"generated Python modules with {generator} in {time.time() - start:.1f} s")
    state_name = common_pb2.JobState.Name

    cluster = su.Cluster(workers=2)
    clusters.append(cluster)
    cluster.wait_up()
    channel = grpc.insecure_channel(cluster.grpc)
    grpc.channel_ready_future(channel).result(timeout=30)
    jobs = job_service_pb2_grpc.JobServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)

    # Standard services: health (the server as a whole, service "", and each hosted service by
    # its full name) and reflection.
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", "fp8rl.v1.JobService", "fp8rl.v1.WorkerRegistry"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        su.check(reply.status == serving, f"health of '{name}': {reply}")
    expect_rpc_error(lambda: health.Check(health_pb2.HealthCheckRequest(service="no.Such"),
                                          timeout=10),
                     grpc.StatusCode.NOT_FOUND, "", "health of an unknown service")
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = list(reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="*"),
              reflection_pb2.ServerReflectionRequest(
                  file_containing_symbol="fp8rl.v1.JobService")]), timeout=10))
    su.check(len(replies) == 2, f"reflection: {len(replies)} replies to 2 requests")
    names = {s.name for s in replies[0].list_services_response.service}
    su.log(f"  reflection lists: {sorted(names)}")
    for name in ("fp8rl.v1.JobService", "grpc.health.v1.Health"):
        su.check(name in names, f"reflection does not list {name}: {sorted(names)}")
    from google.protobuf import descriptor_pb2
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in replies[1].file_descriptor_response.file_descriptor_proto]
    su.check(any(f.name == "fp8rl/v1/job_service.proto" and
                 any(s.name == "JobService" for s in f.service) for f in files),
             f"reflection: no descriptor of job_service.proto: {[f.name for f in files]}")

    # Bad input: INVALID_ARGUMENT naming the field path, NOT_FOUND for unknown ids.
    good = su.smoke_config(cluster.tmp, steps=STEPS)
    unknown = json.loads(json.dumps(good))
    unknown["algorithm"]["bogus_knob"] = 1
    too_few = json.loads(json.dumps(good))
    too_few["algorithm"]["samples_per_prompt"] = 1
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for what, text, field in [
            ("unknown key", yaml.safe_dump(unknown, sort_keys=False), "algorithm.bogus_knob"),
            ("samples_per_prompt: 1", yaml.safe_dump(too_few, sort_keys=False),
             "algorithm.samples_per_prompt"),
            ("empty config", "", "config")]:
        expect_rpc_error(lambda: jobs.SubmitJob(pb.SubmitJobRequest(config=text), timeout=10),
                         invalid, field, f"SubmitJob {what}")
    not_found = grpc.StatusCode.NOT_FOUND
    expect_rpc_error(lambda: jobs.GetJob(pb.GetJobRequest(id="job-does-not-exist"), timeout=10),
                     not_found, "job-does-not-exist", "GetJob unknown id")
    expect_rpc_error(lambda: jobs.CancelJob(pb.CancelJobRequest(id="job-nope"), timeout=10),
                     not_found, "job-nope", "CancelJob unknown id")
    expect_rpc_error(lambda: list(jobs.WatchJob(pb.WatchJobRequest(id="job-nope"), timeout=10)),
                     not_found, "job-nope", "WatchJob unknown id")
    expect_rpc_error(lambda: jobs.GetJobMetrics(pb.GetJobMetricsRequest(id="job-nope"),
                                                timeout=10),
                     not_found, "job-nope", "GetJobMetrics unknown id")

    # The smoke job as YAML text, watched to the end.
    config_text = yaml.safe_dump(good, sort_keys=False)
    reply = jobs.SubmitJob(pb.SubmitJobRequest(config=config_text), timeout=30)
    job_id = reply.job.id
    su.log(f"  submitted {job_id}: {state_name(reply.job.state)}")
    su.check(job_id.startswith("job-"), f"SubmitJob id {job_id!r}")
    su.check(reply.job.state == common_pb2.JOB_STATE_QUEUED, f"new job: {reply.job}")
    su.check(reply.job.total_steps == STEPS, f"total_steps {reply.job.total_steps} != {STEPS}")

    # A second job, submitted while the first one holds the loop, is cancelled while queued.
    second = jobs.SubmitJob(pb.SubmitJobRequest(config=config_text), timeout=30).job
    cancelled = jobs.CancelJob(pb.CancelJobRequest(id=second.id), timeout=10).job
    su.log(f"  cancel {second.id}: {state_name(cancelled.state)}")
    su.check(cancelled.id == second.id, f"CancelJob answered for {cancelled.id}")
    su.check(cancelled.state in (common_pb2.JOB_STATE_CANCELLED, common_pb2.JOB_STATE_RUNNING),
             f"cancelled job: {cancelled}")

    events = watch(jobs, pb, state_name, job_id, timeout=150)
    su.check(events[-1][0] == "JOB_STATE_SUCCEEDED",
             f"job ended {events[-1][0]}: {events[-1][2].error}")
    su.check(events[-1][1] == STEPS, f"last event at step {events[-1][1]} != {STEPS}")
    su.check(len({e[1] for e in events}) >= 2, f"WatchJob showed no progress: {len(events)} events")
    second_events = watch(jobs, pb, state_name, second.id, timeout=60)
    su.check(second_events[-1][0] == "JOB_STATE_CANCELLED",
             f"second job ended {second_events[-1][0]}")

    # A third job is cancelled while it runs: it stops at the next phase boundary.
    long_config = su.smoke_config(cluster.tmp, steps=50)
    long_config["checkpoint"]["every_steps"] = 0
    third = jobs.SubmitJob(pb.SubmitJobRequest(config=yaml.safe_dump(long_config)),
                           timeout=30).job
    sent = {}

    def cancel_when_running(job):
        if not sent and job.state == common_pb2.JOB_STATE_RUNNING and job.step >= 1:
            sent["at_step"] = job.step
            reply = jobs.CancelJob(pb.CancelJobRequest(id=third.id), timeout=10).job
            su.check(reply.state in (common_pb2.JOB_STATE_RUNNING,
                                     common_pb2.JOB_STATE_CANCELLED),
                     f"CancelJob of a running job: {state_name(reply.state)}")

    third_events = watch(jobs, pb, state_name, third.id, timeout=120,
                         on_event=cancel_when_running)
    su.check(sent, "the third job never reached step 1")
    su.check(third_events[-1][0] == "JOB_STATE_CANCELLED",
             f"running job ended {third_events[-1][0]} after CancelJob")
    su.check(third_events[-1][1] < 50, "cancelled job ran every step")
    third_job = jobs.GetJob(pb.GetJobRequest(id=third.id), timeout=10)
    su.check(third_job.error == "cancelled by user", f"cancelled job error {third_job.error!r}")

    expect_rpc_error(lambda: jobs.CancelJob(pb.CancelJobRequest(id=job_id), timeout=10),
                     grpc.StatusCode.FAILED_PRECONDITION, job_id, "CancelJob of a finished job")

    # GetJob: the finished job with its normalized config and latest metrics.
    job = jobs.GetJob(pb.GetJobRequest(id=job_id), timeout=10)
    su.check(job.state == common_pb2.JOB_STATE_SUCCEEDED, f"GetJob: {state_name(job.state)}")
    su.check(job.step == STEPS and job.total_steps == STEPS, f"GetJob steps {job.step}")
    su.check(not job.error, f"GetJob error {job.error!r}")
    config = json.loads(job.config_json)
    su.check(config["algorithm"]["steps"] == STEPS, f"config_json: {job.config_json[:200]}")
    su.check(job.latest_metrics.step == STEPS, f"latest_metrics.step {job.latest_metrics.step}")
    su.check(job.created_unix_ms <= job.updated_unix_ms, "created after updated")

    # GetJobMetrics: rows 0..STEPS; row 0 is the policy before RL, with validation accuracy.
    rows = jobs.GetJobMetrics(pb.GetJobMetricsRequest(id=job_id), timeout=10).steps
    su.check([r.step for r in rows] == list(range(STEPS + 1)),
             f"metrics rows {[r.step for r in rows]} != 0..{STEPS}")
    su.check("val_accuracy" in rows[0].values, f"row 0 lacks val_accuracy: {dict(rows[0].values)}")
    su.check(0.0 <= rows[0].values["val_accuracy"] <= 1.0, "row 0 val_accuracy out of [0, 1]")
    for r in rows[1:]:
        su.check("reward_mean" in r.values, f"row {r.step} lacks reward_mean")
    su.check(all(rows[i].recorded_unix_ms <= rows[i + 1].recorded_unix_ms
                 for i in range(len(rows) - 1)), "metric rows not in recording order")
    su.log(f"  row 0 val_accuracy {rows[0].values['val_accuracy']:.3f}; row {STEPS}: "
           + json.dumps(dict(rows[-1].values))[:240])

    # ListJobs: both jobs, newest first; the state filter and the limit.
    listed = [j.id for j in jobs.ListJobs(pb.ListJobsRequest(), timeout=10).jobs]
    su.check(listed == [third.id, second.id, job_id], f"ListJobs (newest first): {listed}")
    done = [j.id for j in jobs.ListJobs(
        pb.ListJobsRequest(state=common_pb2.JOB_STATE_SUCCEEDED), timeout=10).jobs]
    su.check(done == [job_id], f"ListJobs SUCCEEDED: {done}")
    gone = [j.id for j in jobs.ListJobs(
        pb.ListJobsRequest(state=common_pb2.JOB_STATE_CANCELLED), timeout=10).jobs]
    su.check(gone == [third.id, second.id], f"ListJobs CANCELLED: {gone}")
    newest = [j.id for j in jobs.ListJobs(pb.ListJobsRequest(limit=1), timeout=10).jobs]
    su.check(newest == [third.id], f"ListJobs limit 1: {newest}")
    expect_rpc_error(lambda: jobs.ListJobs(pb.ListJobsRequest(limit=-1), timeout=10),
                     invalid, "limit", "ListJobs limit -1")

    # Still serving after all of the above.
    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    su.check(reply.status == serving, f"health after the run: {reply}")
    su.check(jobs.GetJob(pb.GetJobRequest(id=second.id), timeout=10).state ==
             common_pb2.JOB_STATE_CANCELLED, "second job not CANCELLED in GetJob")
    channel.close()
    cluster.stop(expect_rc=0)
    shutil.rmtree(gen_dir, ignore_errors=True)
    su.log(f"python client test took {time.time() - start:.1f} s")


if __name__ == "__main__":
    su.main_guard(body)
