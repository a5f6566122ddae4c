"""Network faults for the system tests: a network namespace joined to the host namespace by a
veth pair with private addresses (10.231.K.1 on the host side, 10.231.K.2 inside, K unique among
the addresses in use), and the faults applied to that link:

  slow(rate)      tc tbf on both ends: a link of `rate` bit/s whose queue adds delay under load
                  (tc netem's fixed delay where the kernel has sch_netem; see below)
  lossy(percent)  nftables in the namespace drops that share of packets, each way, at random
  partition()     nftables drops every packet, each way (sockets stay open, as in a real split)
  heal()          removes all of the above

Needs root, `ip` (iproute2), `tc` and `nft` (nftables); `available()` says why not. Everything is
removed on close() (the class is a context manager), and `remove_stale()` removes what a test run
killed with SIGKILL left behind (names carry the pid of the run that made them)."""

import os
import random
import shutil
import subprocess

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

    def _nft(self, rule):
        self.ns(["nft", "add", "table", "inet", TABLE])
        for chain, hook in (("in", "input"), ("out", "output")):
            self.ns(["nft", "add", "chain", "inet", TABLE, chain,
                     f"{{ type filter hook {hook} priority 0; policy accept; }}"])
            self.ns(["nft", "flush", "chain", "inet", TABLE, chain])
            self.ns(["nft", "add", "rule", "inet", TABLE, chain, "iifname" if chain == "in"
                     else "oifname", self.ns_if] + rule)

    def lossy(self, percent):
        self._nft(["numgen", "random", "mod", "100", "<", str(percent), "drop"])
        self.faults.append(f"{percent}% loss")

    def partition(self):
        self._nft(["drop"])
        self.faults.append("partition")

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
