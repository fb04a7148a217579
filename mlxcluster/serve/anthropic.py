"""Anthropic's Messages API (`POST /v1/messages`) on mlx-lm's chat completions.

mlx-lm's server speaks OpenAI's API only; tools built on Anthropic's (its
SDK, coding agents) reach a served model through serve's front, which
translates each request to `/v1/chat/completions` and each answer back:

- request: ``system`` (text or text blocks) becomes the first message;
  each message's content (text, or blocks: ``text``, ``tool_use`` as the
  assistant's tool call, ``tool_result`` as a ``tool`` message), then
  ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences``
  (``stop``) and ``tools`` (OpenAI functions: ``input_schema`` is their
  ``parameters``). ``model`` is not passed on (mlx-lm would load a model of
  that name): the answer carries it back as asked.
- answer: the text as a ``text`` block, tool calls as ``tool_use`` blocks,
  ``finish_reason`` as ``stop_reason`` (stop: ``end_turn``, length:
  ``max_tokens``, tool_calls: ``tool_use``), ``usage`` as
  ``input_tokens``/``output_tokens``.
- streamed: OpenAI's chunks become Anthropic's events in order,
  ``message_start``, ``content_block_start``, ``content_block_delta``
  (``text_delta``)..., ``content_block_stop``, ``message_delta`` (the stop
  reason and the output tokens: the front asks mlx-lm for the stream's usage),
  ``message_stop``. A tool call in the stream (mlx-lm sends each whole, in
  one chunk, when its ``</tool_call>`` is generated; other servers send the
  arguments in pieces under one ``index``) becomes its own block:
  ``content_block_start`` (``tool_use``: id, name, empty input), its
  arguments as ``input_json_delta``, ``content_block_stop``; each block
  has the next index.

An example, the request::

    {"model": "m", "max_tokens": 64, "system": "Be brief.",
     "messages": [{"role": "user", "content": "Hello"}]}

goes to mlx-lm as::

    {"messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Hello"}], "max_tokens": 64, "stream": false}
"""

from __future__ import annotations

import json
import uuid

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MessagesError(ValueError):
    """A request the translation cannot take (answered 400, Anthropic's shape)."""


def _text(content) -> str:
    """Text, or the text of a list of text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text")
    raise MessagesError("expected text or a list of text blocks")


def to_chat_request(body: dict) -> dict:
    """The chat-completions request for an Anthropic Messages request."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise MessagesError("messages: a list of {role, content} is required")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise MessagesError("max_tokens: a whole number of at least 1 is required")
    messages: list[dict] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for message in body["messages"]:
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise MessagesError(f"messages: role {role!r} is not user or assistant")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise MessagesError("messages: content is text or a list of blocks")
        texts, calls = [], []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(block.get("text", ""))
            elif kind == "tool_use":
                calls.append({"id": block.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                              "type": "function",
                              "function": {"name": block.get("name", ""),
                                           "arguments": json.dumps(block.get("input") or {})}})
            elif kind == "tool_result":
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                                 "content": _text(block.get("content", ""))})
            else:
                raise MessagesError(f"content blocks of type {kind!r} are not served here "
                                    "(text, tool_use and tool_result are)")
        if texts or calls:
            messages.append({"role": role, "content": "".join(texts),
                             **({"tool_calls": calls} if calls else {})})
    stream = bool(body.get("stream"))
    chat: dict = {"messages": messages, "max_tokens": body["max_tokens"], "stream": stream}
    for name in ("temperature", "top_p", "top_k"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        chat["tools"] = [{"type": "function", "function": {
            "name": tool.get("name", ""), "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {"type": "object"}}}
            for tool in body["tools"]]
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return chat


def from_chat_answer(answer: dict, model: str) -> dict:
    """The Anthropic message for a chat-completions answer."""
    choice = (answer.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {"arguments": function.get("arguments")}
        content.append({"type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
                        "name": function.get("name", ""), "input": arguments})
    usage = answer.get("usage") or {}
    return {"id": f"msg_{answer.get('id') or uuid.uuid4().hex}", "type": "message",
            "role": "assistant", "model": model, "content": content,
            "stop_reason": STOP_REASONS.get(choice.get("finish_reason"), "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0),
                      "output_tokens": int(usage.get("completion_tokens") or 0)}}


def error_body(status: int, message: str) -> bytes:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            429: "rate_limit_error", 503: "overloaded_error", 504: "api_error"}.get(status,
                                                                                 "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class WholeAnswer:
    """A non-streamed answer: kept whole, then translated at its end."""

    content_type = "application/json"

    def __init__(self, model: str):
        self.model, self._body = model, b""

    def feed(self, piece: bytes) -> bytes:
        self._body += piece
        return b""

    def end(self) -> bytes:
        try:
            answer = json.loads(self._body)
        except ValueError:
            return error_body(502, "rank 0's answer was cut short")
        return json.dumps(from_chat_answer(answer, self.model)).encode()


class StreamTranslator:
    """OpenAI's server-sent chunks in (as the bytes come), Anthropic's events out."""

    content_type = "text/event-stream"

    def __init__(self, model: str):
        self.model = model
        self._buffer = b""
        self._started = self._ended = False
        # The block being written: None, "text", or ("tool", OpenAI's call index);
        # blocks are numbered in the order they start.
        self._open: str | tuple[str, int] | None = None
        self._blocks = 0
        self._stop = "end_turn"
        self._output_tokens = 0
        self._input_tokens = 0

    def feed(self, piece: bytes) -> bytes:
        self._buffer += piece
        out = b""
        while b"\n\n" in self._buffer:
            raw, self._buffer = self._buffer.split(b"\n\n", 1)
            for line in raw.decode(errors="replace").splitlines():
                if line.startswith("data:"):
                    out += self._chunk(line[5:].strip())
        return out

    def _chunk(self, data: str) -> bytes:
        out = b"" if self._started else self._start()
        if data == "[DONE]":
            return out + self._finish()
        try:
            chunk = json.loads(data)
        except ValueError:
            return out
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._input_tokens = int(usage.get("prompt_tokens") or 0)
            self._output_tokens = int(usage.get("completion_tokens") or 0)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                out += self._open_block("text", {"type": "text", "text": ""})
                out += event("content_block_delta",
                             {"index": self._blocks - 1, "delta": {"type": "text_delta", "text": text}})
            for position, call in enumerate(delta.get("tool_calls") or []):
                out += self._tool_call(call, position)
            if choice.get("finish_reason"):
                self._stop = STOP_REASONS.get(choice["finish_reason"], "end_turn")
        return out

    def _open_block(self, which: str | tuple[str, int], block: dict) -> bytes:
        """Start ``block`` unless it is the one being written (closing that first)."""
        if self._open == which:
            return b""
        out = self._close_block()
        out += event("content_block_start", {"index": self._blocks, "content_block": block})
        self._open, self._blocks = which, self._blocks + 1
        return out

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return event("content_block_stop", {"index": self._blocks - 1})

    def _tool_call(self, call: dict, position: int) -> bytes:
        """One OpenAI tool-call delta: a new call opens a ``tool_use`` block, its
        arguments (whole, or a piece of them) follow as ``input_json_delta``."""
        function = call.get("function") or {}
        index = call.get("index", position)
        out = self._open_block(("tool", index), {
            "type": "tool_use", "id": call.get("id") or f"toolu_{uuid.uuid4().hex[:24]}",
            "name": function.get("name", ""), "input": {}})
        if function.get("arguments"):
            out += event("content_block_delta", {"index": self._blocks - 1, "delta": {
                "type": "input_json_delta", "partial_json": function["arguments"]}})
        return out

    def _start(self) -> bytes:
        self._started = True
        return event("message_start", {"message": {
            "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})

    def _finish(self) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        out = self._close_block()
        out += event("message_delta", {"delta": {"stop_reason": self._stop, "stop_sequence": None},
                                       "usage": {"output_tokens": self._output_tokens}})
        return out + event("message_stop", {})

    def end(self) -> bytes:
        """What is still owed when the upstream stream ends (no [DONE] seen)."""
        return (b"" if self._started else self._start()) + self._finish()


def translator_for(body: bytes) -> tuple[bytes, WholeAnswer | StreamTranslator]:
    """The chat-completions body for a Messages request, and what translates
    its answer back; ``MessagesError`` for a request it cannot take."""
    try:
        request = json.loads(body or b"{}")
    except ValueError as err:
        raise MessagesError(f"the body is not JSON ({err})") from None
    chat = to_chat_request(request)
    model = str(request.get("model") or "default_model")
    return (json.dumps(chat).encode(),
            StreamTranslator(model) if chat["stream"] else WholeAnswer(model))
