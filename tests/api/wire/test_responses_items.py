"""Responses items as the chat messages the template renders: a stored response's output items (a message
with output_text parts, function calls) continue a conversation as its input items would."""
from __future__ import annotations

from inferd.api.wire.responses_items import item_messages, prompt_chars


def test_output_items_become_an_assistant_message_with_its_calls():
    output = [{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
               "content": [{"type": "output_text", "text": "on it", "annotations": []}]},
              {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}',
               "status": "completed"}]
    assert item_messages(output) == [{"role": "assistant", "content": "on it", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]


def test_a_call_alone_is_an_assistant_message_with_empty_content():
    messages = item_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}])
    assert messages == [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]    # not an object: kept as text


def test_prompt_chars_count_contents_and_calls():
    assert prompt_chars([{"role": "user", "content": "abc"}]) == 3
    assert prompt_chars(item_messages([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])) > 10
