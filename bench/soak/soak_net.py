"""Helpers of bench/soak/soak.py for the network and overload fault kinds: a folder of service
binaries for `fp8rl up --bin-dir` in which two entries are small wrappers, and a TCP relay.

`fp8rl up` starts every service on 127.0.0.1 and has no flag for the coordinator's admission
limits, so the soak points `--bin-dir` at a folder of its own:

  fp8rl-weight-sync, fp8rl-trainer-worker   links to the real binaries
  fp8rl-coordinator        a shell wrapper that adds the soak's coordinator flags
                           (--max-queued-jobs) to what the launcher passes, then execs the binary
  fp8rl-generation-worker  a wrapper that execs the binary unchanged, except for the one worker
                           named in <folder>/netns.json once that file exists: that one is exec'd
                           inside the soak's network namespace (`ip netns exec`, which execs too:
                           the pid `fp8rl up` records is the worker's own), listening on and
                           advertising the namespace's address, and calling the coordinator and
                           weight sync at the host end of the veth pair, where a Relay forwards
                           to their 127.0.0.1 ports.

Every wrapper ends in exec, so `fp8rl up` supervises, signals, restarts and records the service
process itself, as without wrappers."""

import json
import os
import socket
import threading

WORKER_WRAPPER = """#!/usr/bin/python3
# Written by bench/soak/soak.py: the worker named in NETNS runs in the soak's network namespace.
import json, os, sys
REAL = {real!r}
NETNS = {netns!r}
args = sys.argv[1:]
try:
    with open(NETNS) as f:
        spec = json.load(f)
except (OSError, ValueError):
    spec = None
if spec and "--worker-id=" + spec["worker"] in args:
    out = []
    for a in args:
        if a.startswith(("--listen-host=", "--advertise-host=")):
            a = a.split("=", 1)[0] + "=" + spec["ns_ip"]
        elif a.startswith(("--coordinator=", "--weight-sync=")):
            a = a.split("=", 1)[0] + "=" + spec["host_ip"] + ":" + a.rsplit(":", 1)[1]
        out.append(a)
    sys.stdout.write("soak wrapper: in namespace %s as %s\\n" % (spec["ns"], spec["ns_ip"]))
    sys.stdout.flush()
    os.execvp("ip", ["ip", "netns", "exec", spec["ns"], REAL] + out)
os.execv(REAL, [REAL] + args)
"""


def make_bin_dir(folder, real_bin, coordinator_flags):
    """Fills `folder` (see the module's docstring); returns the netns.json path the worker
    wrapper reads."""
    os.makedirs(folder, exist_ok=True)
    netns = os.path.join(folder, "netns.json")
    for name in ("fp8rl-weight-sync", "fp8rl-trainer-worker"):
        link = os.path.join(folder, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(real_bin, name), link)
    flags = " ".join(coordinator_flags)
    scripts = {
        "fp8rl-coordinator": "#!/bin/sh\n# Written by bench/soak/soak.py: the soak's coordinator "
                             f"flags after the launcher's.\nexec {os.path.join(real_bin, 'fp8rl-coordinator')}"
                             f" \"$@\" {flags}\n",
        "fp8rl-generation-worker": WORKER_WRAPPER.format(
            real=os.path.join(real_bin, "fp8rl-generation-worker"), netns=netns),
    }
    for name, text in scripts.items():
        path = os.path.join(folder, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)
    return netns


def write_netns(path, worker, net):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"worker": worker, "ns": net.name, "host_ip": net.host_ip,
                   "ns_ip": net.ns_ip}, f)
    os.replace(tmp, path)


def net_namespace_of(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


class Relay:
    """Listens on `listen` (host, port) and joins every accepted connection to `target`: bytes
    are passed on as they come, each way. A side that ends its sending is shut down for writing
    on the other; both sockets are closed once both ways have ended or either fails (so a long
    run does not pile up descriptors). Daemon threads; close() ends everything."""

    def __init__(self, listen, target):
        self.target = target
        self.accepted = 0
        self._lock = threading.Lock()
        self._open = set()  # Guarded by _lock: sockets of live connections.
        self._server = socket.create_server(listen)
        threading.Thread(target=self._accept, daemon=True).start()

    def live(self):
        with self._lock:
            return len(self._open) // 2

    def _accept(self):
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            with self._lock:
                self.accepted += 1
                self._open |= {client, upstream}
            done = {"ways": 0}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, client, upstream, done),
                                 daemon=True).start()

    def _end(self, pair):
        with self._lock:
            for s in pair:
                self._open.discard(s)
        for s in pair:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes the other way's recv
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def _pump(self, src, dst, a, b, done):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    break
                dst.sendall(data)
        except OSError:
            self._end((a, b))
            return
        with self._lock:
            done["ways"] += 1
            both = done["ways"] == 2
        if both:
            self._end((a, b))

    def close(self):
        self._server.close()
        with self._lock:
            pending = list(self._open)
            self._open.clear()
        for s in pending:
            try:
                s.close()
            except OSError:
                pass
