"""litellm, the proxy and SDK many applications reach their models through, against Tandem as
an "openai/" provider.

    python3 litellm_loop.py HOST:PORT

A completion and its streamed twin (same seed: same text), and a forced tool call whose
arguments parse and fit the tool's schema, then the tool's result and the next turn. Run by
python_clients_test.sh.
"""
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import

import litellm  # noqa: E402
from openai import OpenAI  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12}}}}}]


def main():
    base = f"http://{sys.argv[1]}/v1"
    name = OpenAI(base_url=base, api_key="none").models.list().data[0].id
    common = dict(model=f"openai/{name}", api_base=base, api_key="none", temperature=0.7, seed=4)
    messages = [{"role": "user", "content": "Tell me a story."}]
    plain = litellm.completion(messages=messages, max_tokens=24, **common)
    text = plain.choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(
        messages=messages, max_tokens=24, stream=True, **common))
    assert text and streamed == text, (streamed, text)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = litellm.completion(messages=messages, tools=TOOLS, max_tokens=300,
                              tool_choice={"type": "function",
                                           "function": {"name": "get_weather"}}, **common)
    msg = call.choices[0].message
    assert call.choices[0].finish_reason == "tool_calls" and len(msg.tool_calls) == 1, call
    args = json.loads(msg.tool_calls[0].function.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 12, args
    messages.append(msg.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": msg.tool_calls[0].id,
                     "content": json.dumps({"city": args["city"], "celsius": 22})})
    final = litellm.completion(messages=messages, tools=TOOLS, max_tokens=24, **common)
    assert isinstance(final.choices[0].message.content, str), final
    print(f"litellm: {text!r}; called get_weather({args}); then "
          f"{final.choices[0].message.content!r}")


if __name__ == "__main__":
    main()
