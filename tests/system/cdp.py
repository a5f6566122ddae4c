"""A headless Chromium driven over the DevTools protocol on a loopback websocket, for the system
tests of the web console: open a URL, run JavaScript in the page (clicks, reading the rendered
DOM), wait for a condition, take a PNG screenshot. Needs Debian's `chromium` and
python3-websocket; `available()` says why not when one is missing."""

import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request

try:
    import websocket  # python3-websocket
except ImportError:  # reported by available()
    websocket = None


def chromium_path():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def available():
    """None when a browser can be driven, else the reason (for a SKIP line)."""
    if chromium_path() is None:
        return "chromium not installed (Debian package chromium)"
    if websocket is None:
        return "python3-websocket not installed"
    return None


class JsError(Exception):
    pass


class Browser:
    """One headless Chromium with one page. Use as a context manager."""

    def __init__(self, width=1280, height=1000):
        self.profile = tempfile.mkdtemp(prefix="fp8rl-chromium-")
        # --no-sandbox: the tests run as root in containers, where Chromium's sandbox cannot start.
        args = [chromium_path(), "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
                f"--window-size={width},{height}", "about:blank"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        port = self._devtools_port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            targets = json.load(r)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=30,
                                              suppress_origin=True)
        self.next_id = 0
        self.console = []  # console messages and uncaught exceptions of the page
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _devtools_port(self, timeout=30):
        deadline = time.time() + timeout
        seen = []
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            seen.append(line)
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                return int(m.group(1))
        raise RuntimeError("chromium did not start its DevTools endpoint:\n" + "".join(seen))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        try:
            self.ws.close()
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def call(self, method, params=None, timeout=30):
        self.next_id += 1
        msg_id = self.next_id
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params or {}}))
        deadline = time.time() + timeout
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)
        raise TimeoutError(f"{method}: no answer within {timeout} s")

    def _event(self, msg):
        method = msg.get("method")
        if method == "Runtime.consoleAPICalled":
            args = msg["params"].get("args", [])
            self.console.append(" ".join(str(a.get("value", a.get("description"))) for a in args))
        elif method == "Runtime.exceptionThrown":
            details = msg["params"]["exceptionDetails"]
            self.console.append("exception: " + details.get("exception", {}).get(
                "description", details.get("text", "")))

    def eval(self, expression):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise JsError(details.get("exception", {}).get("description", details.get("text")))
        return result["result"].get("value")

    def open(self, url):
        self.call("Page.navigate", {"url": url})

    def wait_for(self, expression, timeout=30, what=None):
        """Polls a JavaScript expression until it is truthy; returns its value (true for a DOM
        node, which does not cross the protocol by value)."""
        deadline = time.time() + timeout
        last_error = None
        wrapped = f"(() => {{ const v = ({expression}); return v instanceof Node ? true : v; }})()"
        while time.time() < deadline:
            try:
                value = self.eval(wrapped)
                if value:
                    return value
            except JsError as e:  # e.g. the page is still loading
                last_error = e
            time.sleep(0.25)
        try:
            page = self.eval("location.href + ': ' + document.body.innerText.slice(0, 600)")
        except JsError as e:
            page = str(e)
        raise TimeoutError(f"{what or expression}: not true within {timeout} s"
                           f" (last error: {last_error}); page console: {self.console[-5:]};"
                           f" page: {page}")

    def click(self, selector):
        """Clicks an element the way a user would: a mouse press and release at its centre."""
        box = self.eval(f"""(() => {{
            const e = document.querySelector({json.dumps(selector)});
            if (!e) return null;
            e.scrollIntoView({{block: 'center'}});
            const r = e.getBoundingClientRect();
            return [r.left + r.width / 2, r.top + r.height / 2, r.width, r.height];
        }})()""")
        if not box or box[2] == 0 or box[3] == 0:
            raise JsError(f"{selector}: not on the page or not visible")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})

    def type_into(self, selector, text):
        """Focuses a field, clears it and inserts `text` as typed input."""
        self.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                  f" e.focus(); e.value = ''; }})()")
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                         timeout=60)["data"]
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path
