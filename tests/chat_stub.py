"""A real HTTP server that speaks OpenAI's chat-completions API, standing in for a served VLM judge in tests.

``python tests/chat_stub.py --port P`` serves ``GET /v1/models`` and ``POST /v1/chat/completions``. Its reply
is deterministic and depends on the image: it "reads" ``BRIGHT SIGN`` when the image's mean pixel is above
127.5, else ``DARK SIGN`` (``reply_for``). Every request is appended to ``--log`` (one JSON line: model, the
image's mean pixel, the sampling keys), so a test can check what the reward function sent.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BRIGHT, DARK = "BRIGHT SIGN", "DARK SIGN"


def reply_for(mean_pixel: float) -> str:
    return BRIGHT if mean_pixel > 127.5 else DARK


def image_mean(url: str) -> float:
    """The mean pixel (0..255, all channels) of a ``data:image/...;base64,`` image."""
    import numpy as np
    from PIL import Image

    data = base64.b64decode(url.split(",", 1)[1])
    return float(np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64).mean())


def make_handler(log_path: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": "stub-judge", "object": "model"}]})
            else:
                self._send(404, {"error": self.path})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": self.path})
                return
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            urls = [part["image_url"]["url"] for msg in req["messages"] if isinstance(msg["content"], list)
                    for part in msg["content"] if part.get("type") == "image_url"]
            mean = image_mean(urls[-1])
            if log_path:
                with open(log_path, "a") as log:
                    log.write(json.dumps({"model": req.get("model"), "mean": mean,
                                          "keys": sorted(k for k in req if k != "messages")}) + "\n")
            text = reply_for(mean)
            self._send(200, {
                "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model") or "stub-judge",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})

        def log_message(self, *args) -> None:  # quiet
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", default=None)
    args = parser.parse_args()
    ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(args.log)).serve_forever()


if __name__ == "__main__":
    main()
