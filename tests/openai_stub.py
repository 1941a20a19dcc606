"""A loopback OpenAI-compatible endpoint that serves scripted replies, in order.

Used by the tests and by the GPU demonstration of the code-model path. A script is a
JSON list of steps; each request to /v1/chat/completions consumes the next step:

    {"reply": "text"}                         200 with that message
    {"reply_file": "path", "before": "...", "after": "...", "fence": true}
                                              the file's text, fenced as ```python unless fence is false
    {"finish_reason": "length", ...}          any reply step may set the finish reason
    {"status": 429} / {"status": 500}         an HTTP error (retried by the client)
    {"sleep": 5, ...}                         wait before answering (client timeouts)
    {"junk": true}                            200 with a body that is not JSON

When the script runs out, the last step repeats. Usage:
    python tests/openai_stub.py --script steps.json [--port 0]   (prints "PORT <n>")
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Sequence


class Stub:
    def __init__(self, steps: List[Dict[str, Any]], base_dir: str = ".", models: Sequence[str] = ("scripted",)):
        if not steps:
            raise ValueError("the script has no steps")
        self.steps = steps
        self.models = list(models)  # what GET /v1/models lists
        self.base_dir = base_dir
        self.i = 0
        self.lock = threading.Lock()
        self.requests: List[Dict[str, Any]] = []
        self.server: Optional[ThreadingHTTPServer] = None

    def next_step(self) -> Dict[str, Any]:
        with self.lock:
            step = self.steps[min(self.i, len(self.steps) - 1)]
            self.i += 1
            return step

    def text_of(self, step: Dict[str, Any]) -> str:
        if "reply_file" in step:
            path = step["reply_file"]
            if not os.path.isabs(path):
                path = os.path.join(self.base_dir, path)
            with open(path) as f:
                body = f.read()
            if step.get("fence", True):
                body = f"```python\n{body}```"
            return step.get("before", "") + body + step.get("after", "")
        return step.get("reply", "")

    def start(self, port: int = 0) -> int:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: bytes, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                data = [{"id": m, "object": "model"} for m in stub.models]
                self._send(200, json.dumps({"object": "list", "data": data}).encode())

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                req = json.loads(self.rfile.read(n) or b"{}")
                stub.requests.append(req)
                step = stub.next_step()
                if step.get("sleep"):
                    time.sleep(float(step["sleep"]))
                if step.get("status"):
                    err = {"error": {"message": f"scripted HTTP {step['status']}", "type": "scripted"}}
                    self._send(int(step["status"]), json.dumps(err).encode())
                    return
                if step.get("junk"):
                    self._send(200, b"<html>not json</html>", "text/html")
                    return
                text = stub.text_of(step)
                body = {
                    "id": f"chatcmpl-{stub.i}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": req.get("model", "scripted"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": step.get("finish_reason", "stop"),
                        }
                    ],
                    "usage": {
                        "prompt_tokens": sum(len(m.get("content", "")) // 4 for m in req.get("messages", [])),
                        "completion_tokens": len(text) // 4,
                        "total_tokens": 0,
                    },
                }
                self._send(200, json.dumps(body).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server.server_address[1]

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--script", required=True)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    with open(args.script) as f:
        steps = json.load(f)
    stub = Stub(steps, os.path.dirname(os.path.abspath(args.script)))
    port = stub.start(args.port)
    print(f"PORT {port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
