"""Network faults for the system tests: a network namespace joined to the host namespace by a
veth pair with private addresses (10.231.K.1 on the host side, 10.231.K.2 inside, K unique among
the addresses in use), and the faults applied to that link:

  slow(rate)      tc tbf on both ends: a link of `rate` bit/s whose queue adds delay under load
                  (tc netem's fixed delay where the kernel has sch_netem; see below)
  lossy(percent)  nftables in the namespace drops that share of packets, each way, at random
  partition()     nftables drops every packet, each way (sockets stay open, as in a real split)
  partition(ports) only TCP packets to or from those ports on the other end: the service in the
                  namespace is cut off from the services listening there and from no other
  heal()          removes all of the above

A fixed delay needs tc netem (sch_netem), which the kernel of the machine these tests were written
on lacks; `DelayRelay` gives one link a fixed latency in user space instead: a TCP relay that
holds every byte it forwards for the delay, each way (ordered, no rate limit).

Needs root, `ip` (iproute2), `tc` and `nft` (nftables); `available()` says why not. Everything is
removed on close() (the class is a context manager), and `remove_stale()` removes what a test run
killed with SIGKILL left behind (names carry the pid of the run that made them)."""

import os
import queue
import random
import shutil
import socket
import subprocess
import threading
import time

NS_PREFIX = "fp8rl-nf-"
TABLE = "fp8rl_fault"


def run(args, check=True):
    p = subprocess.run(args, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def available():
    """None when network faults can be made here, else the reason (for a SKIP line)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"'{tool}' not installed (scripts/setup.sh installs iproute2 and nftables)"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    p = run(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        return f"ip netns add not permitted here: {p.stderr.strip()}"
    try:
        p = run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", TABLE], check=False)
        if p.returncode != 0:
            return f"nftables not usable in a namespace here: {p.stderr.strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def _pid_of(name):
    tail = name[len(NS_PREFIX):]
    return int(tail) if tail.isdigit() else None


def remove_stale():
    """Removes namespaces (and their processes and veth) of earlier runs whose process is gone."""
    listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        if not name.startswith(NS_PREFIX):
            continue
        pid = _pid_of(name)
        if pid is not None and os.path.exists(f"/proc/{pid}"):
            continue  # a run in progress
        _remove(name, f"fnf{pid}h" if pid is not None else None)


def _remove(ns, host_if):
    pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), 9)
        except (ProcessLookupError, ValueError):
            pass
    if host_if:
        run(["ip", "link", "del", host_if], check=False)
    run(["ip", "netns", "del", ns], check=False)


def _used_subnets():
    text = run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    return {int(w.split(".")[2]) for w in text.split() if w.startswith("10.231.")}


class NetNamespace:
    """One namespace and its veth pair; `host_ip` and `ns_ip` are the two ends' addresses."""

    def __init__(self, rng=None):
        rng = rng or random.Random()
        pid = os.getpid()
        self.name = f"{NS_PREFIX}{pid}"
        self.host_if, self.ns_if = f"fnf{pid}h", f"fnf{pid}n"
        free = sorted(set(range(256)) - _used_subnets())
        if not free:
            raise RuntimeError("no free 10.231.K.0/30 subnet")
        k = rng.choice(free)
        self.host_ip, self.ns_ip = f"10.231.{k}.1", f"10.231.{k}.2"
        self.netem = False
        self.faults = []  # what is applied now, for log lines
        try:
            run(["ip", "netns", "add", self.name])
            run(["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if])
            run(["ip", "link", "set", self.ns_if, "netns", self.name])
            run(["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if])
            run(["ip", "link", "set", self.host_if, "up"])
            self.ns(["ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if])
            self.ns(["ip", "link", "set", self.ns_if, "up"])
            self.ns(["ip", "link", "set", "lo", "up"])
        except Exception:
            self.close()
            raise

    def ns(self, args, check=True):
        return run(["ip", "netns", "exec", self.name] + args, check)

    def command(self, args):
        """`args` run inside the namespace (exec: the pid is the program's own)."""
        return ["ip", "netns", "exec", self.name] + list(args)

    def _qdisc(self, spec):
        for prefix, dev in ((["tc"], self.host_if), (["ip", "netns", "exec", self.name, "tc"],
                                                      self.ns_if)):
            run(prefix + ["qdisc", "replace", "dev", dev, "root"] + spec)

    def slow(self, rate="8mbit", delay_ms=40):
        """A slow link both ways: tc netem delay where the kernel has it (never run on the
        machine these tests were written on, whose kernel lacks sch_netem), else tc tbf at
        `rate` with a 200 ms queue."""
        try:
            self._qdisc(["netem", "delay", f"{delay_ms}ms", "rate", rate])
            self.netem = True
            self.faults.append(f"netem delay {delay_ms} ms, rate {rate}")
        except RuntimeError:
            self._qdisc(["tbf", "rate", rate, "burst", "16kb", "latency", "200ms"])
            self.faults.append(f"tbf rate {rate}")

    def _nft(self, *rules):
        self.ns(["nft", "add", "table", "inet", TABLE])
        for chain, hook in (("in", "input"), ("out", "output")):
            self.ns(["nft", "add", "chain", "inet", TABLE, chain,
                     f"{{ type filter hook {hook} priority 0; policy accept; }}"])
            self.ns(["nft", "flush", "chain", "inet", TABLE, chain])
            for rule in rules:
                self.ns(["nft", "add", "rule", "inet", TABLE, chain, "iifname" if chain == "in"
                         else "oifname", self.ns_if] + rule)

    def lossy(self, percent):
        self._nft(["numgen", "random", "mod", "100", "<", str(percent), "drop"])
        self.faults.append(f"{percent}% loss")

    def partition(self, ports=None):
        """Drops every packet each way; with `ports` (of services on the host end), only TCP
        packets from or to those ports: the namespace's service can still reach the others."""
        if not ports:
            self._nft(["drop"])
            self.faults.append("partition")
            return
        listed = "{ " + ", ".join(str(p) for p in ports) + " }"
        # In: replies from (and calls of) the host's services; out: the namespace's calls to
        # them. A service in the namespace listens on its own ports, so these match no other.
        self._nft(["tcp", "sport", listed, "drop"], ["tcp", "dport", listed, "drop"])
        self.faults.append(f"partition from ports {sorted(ports)}")

    def heal(self):
        self.ns(["nft", "delete", "table", "inet", TABLE], check=False)
        run(["tc", "qdisc", "del", "dev", self.host_if, "root"], check=False)
        self.ns(["tc", "qdisc", "del", "dev", self.ns_if, "root"], check=False)
        self.faults = []

    def close(self):
        _remove(self.name, self.host_if)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DelayRelay:
    """Listens on `listen` (host, port) and connects each accepted connection to `target` (host,
    port); every chunk read from either side is sent on `delay_s` later, in order. A service told
    to call the relay instead of its peer sees a link with that latency each way (a round trip
    costs 2 x delay_s). `forwarded` counts the bytes passed on, so a test can tell the link was
    used. Daemon threads; close() stops accepting and closes every connection."""

    def __init__(self, listen, target, delay_s):
        self.target, self.delay_s = target, delay_s
        self.forwarded = 0
        self._lock = threading.Lock()
        self._socks = []  # Guarded by _lock.
        self._server = socket.create_server(listen)
        threading.Thread(target=self._accept, daemon=True).start()

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
            with self._lock:
                self._socks += [client, upstream]
            self._pump(client, upstream)
            self._pump(upstream, client)

    def _pump(self, src, dst):
        chunks = queue.Queue()

        def read():
            while True:
                try:
                    data = src.recv(1 << 16)
                except OSError:
                    data = b""
                chunks.put((time.monotonic() + self.delay_s, data))
                if not data:
                    return

        def write():
            while True:
                due, data = chunks.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                try:
                    if not data:
                        dst.shutdown(socket.SHUT_WR)
                        return
                    dst.sendall(data)
                    with self._lock:
                        self.forwarded += len(data)
                except OSError:
                    src.close()  # the other end is gone: end the reader too
                    return

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self):
        self._server.close()
        with self._lock:
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
