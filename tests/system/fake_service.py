#!/usr/bin/env python3
"""A stand-in for an fp8rl service binary, used by cli_launcher_test to exercise the local
launcher (spawn, health wait, supervision, shutdown) in a second without the real services.

    fake_service.py --fake-name=NAME [service flags as the launcher passes them]

Listens on --grpc-port (plain TCP accept) and on --http-port/--metrics-port (GET /healthz,
GET /metrics) on --listen-host. Behaviour is chosen per service name through the environment:
  FP8RL_FAKE_FAIL=NAME          print an error and exit 3 at once
  FP8RL_FAKE_UNHEALTHY=NAME     answer /healthz with 503 forever
  FP8RL_FAKE_IGNORE_TERM=NAME   ignore SIGTERM (the launcher must SIGKILL it)
  FP8RL_FAKE_PID_DIR=DIR        write DIR/NAME.pid
  FP8RL_FAKE_CRASH_DIR=DIR      exit 4 at once while DIR/NAME.crash exists (a test creates it to
                                make every restart of NAME crash)
SIGTERM exits 0 otherwise.
"""

import http.server
import os
import signal
import socket
import sys
import threading


def flag(args, name, default=None):
    for a in args:
        if a.startswith("--" + name + "="):
            return a.split("=", 1)[1]
    return default


def main(args):
    name = flag(args, "fake-name")
    host = flag(args, "listen-host", "127.0.0.1")
    grpc_port = int(flag(args, "grpc-port"))
    http_port = int(flag(args, "http-port") or flag(args, "metrics-port"))
    print(f"fake {name}: started with {' '.join(args)}", flush=True)
    pid_dir = os.environ.get("FP8RL_FAKE_PID_DIR")
    if pid_dir:
        # Written under another name and renamed: a service stopped while writing (the launcher
        # stops the rest when one fails) leaves no empty NAME.pid behind.
        tmp = os.path.join(pid_dir, "." + name + ".pid.tmp")
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, os.path.join(pid_dir, name + ".pid"))
    if os.environ.get("FP8RL_FAKE_FAIL") == name:
        print(f"fake {name}: bad flag --grpc-port: simulated failure", flush=True)
        sys.exit(3)
    crash_dir = os.environ.get("FP8RL_FAKE_CRASH_DIR")
    if crash_dir and os.path.exists(os.path.join(crash_dir, name + ".crash")):
        print(f"fake {name}: simulated crash at start", flush=True)
        sys.exit(4)
    if os.environ.get("FP8RL_FAKE_IGNORE_TERM") == name:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    healthy = os.environ.get("FP8RL_FAKE_UNHEALTHY") != name

    grpc_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    grpc_sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    grpc_sock.bind((host, grpc_port))
    grpc_sock.listen(16)

    def accept_loop():
        while True:
            conn, _ = grpc_sock.accept()
            conn.close()

    threading.Thread(target=accept_loop, daemon=True).start()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/healthz":
                code, body = (200, b'{"status":"ok"}') if healthy else (503, b'{"status":"no"}')
            elif self.path == "/metrics":
                code, body = 200, b"# TYPE fake_up gauge\nfake_up 1\n"
            else:
                code, body = 404, b"{}"
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    http.server.ThreadingHTTPServer.allow_reuse_address = True
    server = http.server.ThreadingHTTPServer((host, http_port), Handler)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
