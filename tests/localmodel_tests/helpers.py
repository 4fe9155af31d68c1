"""Helpers for the local-model tests: a fake OpenAI-compatible server and synthetic GGUF files."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

FAKE_SERVER = r"""
import json, sys, time, signal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
if "--ignore-term" in args:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if "--exit-now" in args:
    print("fake: boom, Illegal instruction", file=sys.stderr, flush=True)
    sys.exit(3)
if "--no-listen" in args:
    time.sleep(60)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "fake-alias", "object": "model"}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send({"id": "x", "object": "chat.completion", "created": 0, "model": "fake-alias",
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "pong"}}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8}})
print("fake: listening", port, flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def gone(pid: int) -> bool:
    """True when no process ``pid`` exists any more."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def fake_command(script: Path, port: int, *flags: str) -> list[str]:
    """argv running the fake server on ``port``."""
    return [sys.executable, str(script), "--port", str(port), *flags]


def _gguf_string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack("<Q", len(raw)) + raw


def write_gguf(
    path: Path, kvs: list[tuple[str, int, bytes]], *, magic: bytes = b"GGUF", version: int = 3
) -> Path:
    """Write a header-only GGUF: ``kvs`` are (key, value type, packed value)."""
    body = magic + struct.pack("<IQQ", version, 0, len(kvs))
    for key, vtype, value in kvs:
        body += _gguf_string(key) + struct.pack("<I", vtype) + value
    path.write_bytes(body)
    return path


def qwen_like_kvs(context_length: int = 32768) -> list[tuple[str, int, bytes]]:
    """Header entries shaped like the packaged Qwen GGUF (string, uint32, float, arrays, bool)."""
    tokens = struct.pack("<IQ", 8, 3) + b"".join(_gguf_string(t) for t in ("a", "b", "<|im_end|>"))
    return [
        ("general.architecture", 8, _gguf_string("qwen2")),
        ("general.name", 8, _gguf_string("Tiny Test Model")),
        ("qwen2.context_length", 4, struct.pack("<I", context_length)),
        ("qwen2.rope.freq_base", 6, struct.pack("<f", 1000000.0)),
        ("general.file_type", 4, struct.pack("<I", 15)),
        ("tokenizer.ggml.add_bos_token", 7, struct.pack("<?", False)),
        ("tokenizer.ggml.tokens", 9, tokens),
        ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 1, 3)),
        ("tokenizer.chat_template", 8, _gguf_string("{% for m in messages %}{{ m.content }}{% endfor %}")),
    ]
