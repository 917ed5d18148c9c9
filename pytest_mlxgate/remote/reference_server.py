"""The reference implementation of the mlxgate log-probability protocol (`remote.protocol`): an mlx_lm model
behind `GET /v1/mlxgate`, `POST /v1/mlxgate/logprobs` and `GET /v1/models`, one forward per request.

    python -m pytest_mlxgate.remote.reference_server --model DIR [--host 127.0.0.1] [--port 8090]

It is what the tests run the server arm against, and what a server's author reads beside
`docs/server-protocol.md`: the rows are the model's log-softmax at the asked positions of one teacher-forced
forward over the given tokens, float32, the top k by `argsort` (most likely first, the lower id first
among equals). Requests are served one at a time (a lock around the model).
"""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np

from .protocol import INFO_ROUTE, LOGPROBS_ROUTE, PROTOCOL

__all__ = ["ReferenceModel", "main", "serve"]

#: The most positions one request may ask: a whole row is the vocabulary's log-probabilities.
MAX_POSITIONS = 4096


class ReferenceModel:
    """The model the server answers for, and the one computation it answers with."""

    def __init__(self, model: Any, model_id: str, vocab_size: int) -> None:
        self.model, self.model_id, self.vocab_size = model, model_id, vocab_size
        self.lock = threading.Lock()

    def info(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "model": self.model_id, "vocab_size": self.vocab_size, "max_top_k": None}

    def rows(self, tokens: Sequence[int], positions: Sequence[int], top_k: int | None) -> list[dict[str, Any]]:
        """Each asked position's log-probabilities from one forward over `tokens`."""
        with self.lock:
            logits = self.model(mx.array([list(tokens)], dtype=mx.int32))[0].astype(mx.float32)
            picked = np.array(logits[mx.array(list(positions))], dtype=np.float64)
        picked -= picked.max(axis=-1, keepdims=True)
        logprobs = picked - np.log(np.exp(picked).sum(axis=-1, keepdims=True))
        out = []
        for p, row in zip(positions, logprobs, strict=True):
            if top_k is None:
                out.append({"position": p, "ids": None, "logprobs": row.tolist()})
            else:
                ids = np.argsort(-row, kind="stable")[:top_k]
                out.append({"position": p, "ids": ids.tolist(), "logprobs": row[ids].tolist()})
        return out


def _handler(served: ReferenceModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == f"/v1/{INFO_ROUTE}":
                self._json(200, served.info())
            elif self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": served.model_id, "object": "model"}]})
            else:
                self._json(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") != f"/v1/{LOGPROBS_ROUTE}":
                self._json(404, {"error": f"no route {self.path}"})
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                tokens, positions, top_k = _request(body, served.vocab_size)
            except ValueError as e:
                self._json(400, {"error": str(e)})
                return
            self._json(200, {"model": served.model_id, "rows": served.rows(tokens, positions, top_k)})

        def _json(self, status: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def _request(body: Any, vocab_size: int) -> tuple[list[int], list[int], int | None]:
    """(tokens, positions, top_k) of a logprobs request; ValueError saying what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    tokens, positions, top_k = body.get("tokens"), body.get("positions"), body.get("top_k")
    if (
        not isinstance(tokens, list)
        or not tokens
        or not all(isinstance(t, int) and 0 <= t < vocab_size for t in tokens)
    ):
        raise ValueError(f"tokens must be a non-empty list of ids in [0, {vocab_size})")
    if not isinstance(positions, list) or not positions or len(positions) > MAX_POSITIONS:
        raise ValueError(f"positions must be a list of 1 to {MAX_POSITIONS} indices")
    if not all(isinstance(p, int) and 0 <= p < len(tokens) for p in positions):
        raise ValueError(f"positions must be indices into tokens (0 to {len(tokens) - 1})")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError("top_k must be null (the whole distribution) or a whole number >= 1")
    return tokens, positions, top_k


def serve(model_dir: str, host: str, port: int) -> ThreadingHTTPServer:
    """A started server (its thread a daemon) for the model in `model_dir`."""
    model = mlx_lm.load(model_dir)[0]
    vocab = int(model(mx.array([[0]]))[0].shape[-1])
    httpd = ThreadingHTTPServer((host, port), _handler(ReferenceModel(model, model_dir, vocab)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="an mlx_lm model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args(argv)
    httpd = serve(args.model, args.host, args.port)
    print(f"mlxgate reference server: http://{args.host}:{httpd.server_address[1]}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
