"""Anthropic's Messages API on mlx-lm's chat completions (serve/anthropic.py):
the translation both ways, streamed too. The real `anthropic` client against
the real server: tests/test_serve.py's long-answer test."""

from __future__ import annotations

import json

import pytest

from mlxcluster.serve.anthropic import (
    MessagesError,
    StreamTranslator,
    from_chat_answer,
    to_chat_request,
)


def test_system_turns_blocks_tools_and_sampling_are_translated():
    chat = to_chat_request({
        "model": "claude-x", "max_tokens": 64, "temperature": 0.2, "top_p": 0.9,
        "stop_sequences": ["\n\n"],
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "weather", "description": "the weather",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "Thanks"}]}]})
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "Thanks"}]
    assert chat["max_tokens"] == 64 and chat["temperature"] == 0.2 and chat["top_p"] == 0.9
    assert chat["stop"] == ["\n\n"] and chat["stream"] is False and "model" not in chat
    assert chat["tools"][0]["function"]["parameters"]["properties"] == {"city": {"type": "string"}}


@pytest.mark.parametrize("body, said", [
    ({"max_tokens": 5}, "messages"),
    ({"messages": [], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, "role 'system'"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}], "max_tokens": 5}, "'image'"),
])
def test_what_cannot_be_translated_is_said(body, said):
    with pytest.raises(MessagesError, match=said):
        to_chat_request(body)


def test_an_answer_with_text_and_a_tool_call_becomes_blocks():
    message = from_chat_answer({
        "id": "chatcmpl-1", "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7}}, "claude-x")
    assert message["content"] == [{"type": "text", "text": "Looking."},
                                  {"type": "tool_use", "id": "call_9", "name": "weather",
                                   "input": {"city": "Oslo"}}]
    assert message["stop_reason"] == "tool_use" and message["model"] == "claude-x"
    assert message["usage"] == {"input_tokens": 12, "output_tokens": 7}


def test_a_stream_becomes_anthropic_s_events_whatever_the_pieces():
    chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"delta": {"content": "Once"}}]},
              {"choices": [{"delta": {"content": " upon"}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}]
    raw = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
    translator = StreamTranslator("m")
    out = b"".join(translator.feed(raw[i:i + 7]) for i in range(0, len(raw), 7)) + translator.end()
    events = [(block.split("\n")[0][7:], json.loads(block.split("\n")[1][6:]))
              for block in out.decode().strip().split("\n\n")]
    assert [kind for kind, _ in events] == ["message_start", "content_block_start",
                                            "content_block_delta", "content_block_delta",
                                            "content_block_stop", "message_delta", "message_stop"]
    assert "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta") == \
        "Once upon"
    assert events[5][1]["delta"]["stop_reason"] == "max_tokens"
    assert events[5][1]["usage"] == {"output_tokens": 2}


def test_a_streamed_tool_call_is_a_tool_use_block_after_the_text():
    """mlx-lm sends a call whole in one chunk; others send its arguments in
    pieces under one index: both become one tool_use block, the next index."""
    whole = {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    chunks = [{"choices": [{"delta": {"content": "Let me look."}}]},
              {"choices": [{"delta": {"tool_calls": [whole]}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 1, "id": "call_2", "function": {
                  "name": "get_time", "arguments": '{"tz": '}}]}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 1, "function": {"arguments": '"CET"}'}}]},
                            "finish_reason": "tool_calls"}]}]
    raw = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
    translator = StreamTranslator("m")
    out = translator.feed(raw) + translator.end()
    events = [(block.split("\n")[0][7:], json.loads(block.split("\n")[1][6:]))
              for block in out.decode().strip().split("\n\n")]
    assert [(k, e.get("index")) for k, e in events] == [
        ("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
        ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
        ("content_block_stop", 1), ("content_block_start", 2), ("content_block_delta", 2),
        ("content_block_delta", 2), ("content_block_stop", 2), ("message_delta", None),
        ("message_stop", None)]
    assert events[4][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather",
                                             "input": {}}
    assert "".join(e["delta"]["partial_json"] for k, e in events[8:10]) == '{"tz": "CET"}'
    assert events[11][1]["delta"]["stop_reason"] == "tool_use"
