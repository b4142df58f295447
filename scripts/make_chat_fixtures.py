#!/usr/bin/env python3
"""Make the chat-template fixtures of an agent loop, rendered by jinja2 as transformers does.

What it makes
-------------
tests/fixtures/chat/NAME.json for NAME.jinja, qwen2.5_tools (Qwen2.5-Instruct's tool-use
template) and tools_short (its handling of tools in few tokens, for stories260K's 512-token
context in the cluster tests): the template rendered for the conversations of an agent loop,
with the messages in the form Tandem's HTTP API passes them to a template (http/openai.cc
Messages, as vLLM passes them): an assistant turn that only called tools has content "" (the
API's null), its tool_calls' arguments are objects (the API carries them as JSON text), and
tool results keep tool_call_id and name.

  {"template": "NAME.jinja", "jinja2_version",
   "cases": [{"name", "messages", "tools", "add_generation_prompt", "rendered"}]}

The environment is the one transformers' apply_chat_template uses: jinja2's
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, a `tojson` that
keeps non-ASCII text, and raise_exception. Needs only jinja2 (Debian's python3-jinja2).

    python3 scripts/make_chat_fixtures.py
"""
import json
import os

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = ["qwen2.5_tools", "tools_short"]
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "chat")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"]}}}]

USER = {"role": "user", "content": "What is the weather in Paris and in Zürich?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
TWO_CALLS = {"role": "assistant", "content": "Let me look.", "tool_calls": [
    {"id": "call_1", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}},
    {"id": "call_2", "type": "function",
     "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "22 C, sunny"}
RESULT2 = {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "18 C"}

CASES = [
    ("no tools", [{"role": "user", "content": "Hello!"}], None, True),
    ("first turn", [USER], TOOLS, True),
    ("second turn", [{"role": "system", "content": "Be brief."}, USER, CALL, RESULT], TOOLS, True),
    ("parallel calls, then an answer",
     [USER, TWO_CALLS, RESULT, RESULT2,
      {"role": "assistant", "content": "Paris 22 C, Zürich 18 C."},
      {"role": "user", "content": "Thanks"}], TOOLS, True),
    ("tool results last, no generation prompt", [USER, CALL, RESULT], TOOLS, False),
]


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def main():
    for name in TEMPLATES:
        with open(os.path.join(FIXTURES, name + ".jinja")) as f:
            template = environment().from_string(f.read())
        cases = []
        for case, messages, tools, add_generation_prompt in CASES:
            rendered = template.render(messages=messages, tools=tools, documents=None,
                                       add_generation_prompt=add_generation_prompt,
                                       eos_token="<|im_end|>")
            cases.append({"name": case, "messages": messages, "tools": tools,
                          "add_generation_prompt": add_generation_prompt, "rendered": rendered})
        out = {"template": name + ".jinja", "jinja2_version": jinja2.__version__, "cases": cases}
        with open(os.path.join(FIXTURES, name + ".json"), "w") as f:
            json.dump(out, f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
