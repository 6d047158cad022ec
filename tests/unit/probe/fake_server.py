"""A loopback imitation of vLLM's OpenAI server, for testing ``vllm-graphsafe probe``.

The fake "model" answers greedily and deterministically: token ``i`` of the answer
is a hash of the prompt ids and ``i``, mapped into the vocabulary. Fields of
``FakeConfig`` inject each kind of corruption the probe must catch, and each kind
of server failure it must report.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BOS_ID = 1
USER_ID = 2
END_OF_TURN_ID = 3
ASSISTANT_ID = 4
NEWLINE_ID = 5
BYTE_OFFSET = 10  # byte b is token b + 10
EXCLAMATION_ID = BYTE_OFFSET + ord("!")
#: The one process whose statistics record the fake keeps (``FakeConfig.stats_dir``).
STATS_PID = 4242
STATS_PATCH = "v1-phase-dispatch"
STATS_EVENT = "completions_answered"


@dataclass
class FakeConfig:
    model_id: str = "fake/hybrid-tiny"
    vocab_size: int = 1000
    max_model_len: int = 4096
    # Corruption, by prompt length.
    oov_lengths: frozenset[int] = frozenset()
    repeat_lengths: frozenset[int] = frozenset()
    repeat_everywhere: bool = False
    cold_warm_lengths: frozenset[int] = frozenset()
    corrupt_overlapping: bool = False
    perturb_streams: bool = False
    # Server behaviour.
    tokenize_missing: bool = False
    chat_template: bool = True
    completion_status: int | None = None
    completion_hang_s: float = 0.0
    omit_token_ids: bool = False
    states_vocab_size: bool = True
    overlap_window_s: float = 0.05
    stream_token_delay_s: float = 0.001
    # Seconds each completion that is not streamed takes to answer once a
    # streamed one has been asked for (the prompts inserted into the decode).
    answer_delay_s: float = 0.0
    # Only while the first this many streams have been asked for (0: always),
    # as a loaded server that catches up.
    slow_answers_for_streams: int = 0
    # Not vLLM at all: a plain web server answering every path with a 404 page.
    plain_web_server: bool = False
    # Like ``vllm serve --api-key``: every /v1 path wants this bearer token.
    api_key: str | None = None
    # Error messages quote the Authorization header back (a careless proxy).
    echo_authorization: bool = False
    # Completions close the connection without answering.
    drop_completions: bool = False
    # Like a server with the plugin: a statistics record here counts every
    # completion request before it is answered (``STATS_PID``, ``STATS_EVENT``).
    stats_dir: Path | None = None


@dataclass
class ServerLog:
    """What the fake saw: every request's method and path, in arrival order."""

    requests: list[tuple[str, str]] = field(default_factory=list)
    completion_prompt_lengths: list[int] = field(default_factory=list)
    #: Each answered completion that is not streamed: its prompt length, and
    #: whether a stream was sending tokens from its arrival until its answer.
    inside_a_stream: list[tuple[int, bool]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.requests)


def tokenize_text(text: str, add_special_tokens: bool) -> list[int]:
    ids = [BYTE_OFFSET + byte for byte in text.encode()]
    return [BOS_ID, *ids] if add_special_tokens else ids


def detokenize(ids: list[int], vocab_size: int) -> str:
    pieces = []
    for token_id in ids:
        if BYTE_OFFSET <= token_id < BYTE_OFFSET + 128:
            pieces.append(chr(token_id - BYTE_OFFSET))
        elif token_id < vocab_size:
            pieces.append(f"<{token_id}>")
    return "".join(pieces)


def hashed_token(prompt: list[int], index: int, salt: str, vocab_size: int) -> int:
    packed = array("q", prompt).tobytes()  # fast for 100k-token prompts
    digest = hashlib.sha256(f"{salt}|{index}|".encode() + packed).digest()
    return BYTE_OFFSET + int.from_bytes(digest[:4], "big") % (vocab_size - BYTE_OFFSET)


class FakeVllm:
    """The fake model and the bookkeeping behind its corruption modes."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.log = ServerLog()
        self.stopping = threading.Event()
        #: Set once a completion request has arrived (and may be hanging).
        self.completion_arrived = threading.Event()
        self._lock = threading.Lock()
        self._seen_prompts: set[tuple[int, ...]] = set()
        self._active: list[dict[str, bool]] = []
        self._streams_sending = 0
        self._streams_asked = 0
        self._arrivals = 0
        self._completions = 0
        if config.stats_dir is not None:
            self._write_stats()

    def count_completion(self) -> None:
        with self._lock:
            self._completions += 1
            if self.config.stats_dir is not None:
                self._write_stats()

    def _write_stats(self) -> None:
        assert self.config.stats_dir is not None
        record = {
            "pid": STATS_PID,
            "patches": {STATS_PATCH: "applied"},
            "counts": {STATS_PATCH: {STATS_EVENT: self._completions}},
        }
        final = self.config.stats_dir / f"{STATS_PID}.json"
        staged = final.with_name(final.name + ".staged")
        staged.write_text(json.dumps(record))
        os.replace(staged, final)

    def answer(self, prompt: list[int], max_tokens: int, warm: bool) -> list[int]:
        config = self.config
        length = len(prompt)
        salt = "warm" if warm and length in config.cold_warm_lengths else "cold"
        ids = [
            hashed_token(prompt, i, salt, config.vocab_size) for i in range(max_tokens)
        ]
        if length in config.oov_lengths:
            ids[1::2] = [config.vocab_size + i for i in range(len(ids[1::2]))]
        if config.repeat_everywhere or length in config.repeat_lengths:
            ids = ids[:2] + [EXCLAMATION_ID] * (max_tokens - 2)
        return ids

    def remember(self, prompt: list[int]) -> bool:
        """Whether the prompt was seen before (and so hits the 'prefix cache')."""
        key = tuple(prompt)
        with self._lock:
            seen = key in self._seen_prompts
            self._seen_prompts.add(key)
            return seen

    def enter(self) -> tuple[dict[str, bool], int]:
        marker = {"overlapped": False}
        with self._lock:
            self._arrivals += 1
            if self._active:
                marker["overlapped"] = True
                for other in self._active:
                    other["overlapped"] = True
            self._active.append(marker)
            return marker, self._arrivals

    def leave(self, marker: dict[str, bool]) -> None:
        with self._lock:
            self._active.remove(marker)

    def arrivals(self) -> int:
        with self._lock:
            return self._arrivals

    def stream_sending(self, sending: bool) -> None:
        with self._lock:
            self._streams_sending += 1 if sending else -1
            self._streams_asked += sending

    def streams_asked(self) -> int:
        with self._lock:
            return self._streams_asked

    def streams_sending(self) -> int:
        with self._lock:
            return self._streams_sending


class FakeHandler(BaseHTTPRequestHandler):
    server: FakeHttpServer
    # Headers and body leave in one segment: no Nagle / delayed-ACK stalls.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args: Any) -> None:
        pass

    @property
    def fake(self) -> FakeVllm:
        return self.server.fake

    def refused(self) -> bool:
        """Answer as a plain web server or a key-protected vLLM would; or not."""
        config = self.fake.config
        if config.plain_web_server:
            page = b"<html><head><title>404 Not Found</title></head><body>" + (
                b"<h1>Not Found</h1></body></html>"
            )
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return True
        protected = config.api_key is not None and self.path.startswith("/v1")
        if (
            protected
            and self.headers.get("Authorization") != f"Bearer {config.api_key}"
        ):
            self.send_json(401, {"error": "Unauthorized"})
            return True
        return False

    def do_GET(self) -> None:
        self.fake.log.requests.append(("GET", self.path))
        if self.refused():
            return
        if self.path == "/v1/models":
            config = self.fake.config
            model = {
                "id": config.model_id,
                "object": "model",
                "owned_by": "vllm",
                "root": config.model_id,
                "parent": None,
                "max_model_len": config.max_model_len,
            }
            self.send_json(200, {"object": "list", "data": [model]})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        self.fake.log.requests.append(("POST", self.path))
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.refused():
            return
        if self.path == "/tokenize" and not self.fake.config.tokenize_missing:
            self.tokenize(body)
        elif self.path == "/v1/completions":
            self.complete(body)
        else:
            self.send_json(404, {"detail": "Not Found"})

    def tokenize(self, body: dict[str, Any]) -> None:
        if "messages" in body:
            if not self.fake.config.chat_template:
                self.send_error_json(400, "this model has no chat template")
                return
            content = "".join(m["content"] for m in body["messages"])
            ids = [BOS_ID, USER_ID, *tokenize_text(content, False), END_OF_TURN_ID]
            ids += [ASSISTANT_ID, NEWLINE_ID]
        else:
            ids = tokenize_text(body["prompt"], body.get("add_special_tokens", True))
        self.send_json(
            200,
            {
                "count": len(ids),
                "max_model_len": self.fake.config.max_model_len,
                "tokens": ids,
            },
        )

    def complete(self, body: dict[str, Any]) -> None:
        config = self.fake.config
        self.fake.completion_arrived.set()
        self.fake.count_completion()
        if config.completion_hang_s:
            self.fake.stopping.wait(config.completion_hang_s)
        if config.drop_completions:
            self.close_connection = True
            return
        if config.completion_status is not None:
            message = "EngineCore died"
            if config.echo_authorization:
                message += f" (request had {self.headers.get('Authorization')})"
            self.send_error_json(config.completion_status, message)
            return
        for token_id in body.get("logit_bias") or {}:
            if int(token_id) >= config.vocab_size:
                message = "token_id(s) in logit_bias contain out-of-vocab token ids"
                if config.states_vocab_size:
                    message += f". Vocabulary size: {config.vocab_size}"
                self.send_error_json(400, message)
                return
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt = tokenize_text(prompt, True)
        self.fake.log.completion_prompt_lengths.append(len(prompt))
        warm = self.fake.remember(prompt)
        marker, arrivals = self.fake.enter()
        try:
            if body.get("stream"):
                self.stream(body, prompt, arrivals)
                return
            in_stream_at_arrival = self.fake.streams_sending() > 0
            if config.corrupt_overlapping:
                time.sleep(config.overlap_window_s)
            streams = self.fake.streams_asked()
            if streams and (
                not config.slow_answers_for_streams
                or streams <= config.slow_answers_for_streams
            ):
                time.sleep(config.answer_delay_s)
            ids = self.fake.answer(prompt, body["max_tokens"], warm)
            self.fake.log.inside_a_stream.append(
                (len(prompt), in_stream_at_arrival and self.fake.streams_sending() > 0)
            )
            if config.corrupt_overlapping and marker["overlapped"]:
                ids = [
                    hashed_token(prompt, i, "mixed", config.vocab_size)
                    for i in range(len(ids))
                ]
        finally:
            self.fake.leave(marker)
        choice: dict[str, Any] = {
            "index": 0,
            "text": detokenize(ids, config.vocab_size),
            "logprobs": None,
            "finish_reason": "length",
        }
        if body.get("return_token_ids") and not config.omit_token_ids:
            choice["token_ids"] = ids
        self.send_json(
            200,
            {
                "id": "cmpl-fake",
                "object": "text_completion",
                "model": config.model_id,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids),
                    "total_tokens": len(prompt) + len(ids),
                },
            },
        )

    def stream(self, body: dict[str, Any], prompt: list[int], arrivals: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.fake.stream_sending(True)
        try:
            self.send_stream(body, prompt, arrivals)
        finally:
            self.fake.stream_sending(False)

    def send_stream(
        self, body: dict[str, Any], prompt: list[int], arrivals: int
    ) -> None:
        """The answer's events; a client that hangs up ends them (BrokenPipeError)."""
        config = self.fake.config
        for index, token_id in enumerate(
            self.stream_ids(prompt, body["max_tokens"], arrivals)
        ):
            last = index == body["max_tokens"] - 1
            choice: dict[str, Any] = {
                "index": 0,
                "text": detokenize([token_id], config.vocab_size),
                "logprobs": None,
                "finish_reason": "length" if last else None,
            }
            if body.get("return_token_ids") and not config.omit_token_ids:
                choice["token_ids"] = [token_id]
            event: dict[str, Any] = {"id": "cmpl-fake", "choices": [choice]}
            if (body.get("stream_options") or {}).get("continuous_usage_stats"):
                event["usage"] = {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": index + 1,
                    "total_tokens": len(prompt) + index + 1,
                }
            self.send_event(event)
            time.sleep(config.stream_token_delay_s)
        usage = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"]}
        self.send_event({"id": "cmpl-fake", "choices": [], "usage": usage})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def stream_ids(
        self, prompt: list[int], max_tokens: int, arrivals: int
    ) -> Iterator[int]:
        config = self.fake.config
        for index in range(max_tokens):
            disturbed = config.perturb_streams and self.fake.arrivals() != arrivals
            salt = "disturbed" if disturbed else "cold"
            yield hashed_token(prompt, index, salt, config.vocab_size)

    def send_event(self, payload: dict[str, Any]) -> None:
        self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
        self.wfile.flush()

    def send_error_json(self, status: int, message: str) -> None:
        error = {"message": message, "type": "BadRequestError", "code": status}
        self.send_json(status, {"error": error})

    def send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeHttpServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, fake: FakeVllm) -> None:
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.fake = fake

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A probe that timed out has hung up; writing to it fails, as intended.
        pass


class RunningFakeServer:
    """Context manager: a fake vLLM on an ephemeral loopback port."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.fake = FakeVllm(config or FakeConfig())
        self.http = FakeHttpServer(self.fake)
        self.thread = threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def log(self) -> ServerLog:
        return self.fake.log

    def __enter__(self) -> RunningFakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.fake.stopping.set()
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(timeout=5)
