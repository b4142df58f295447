"""An agent loop through the official `openai` client, as LangChain and the SDK's examples run it.

    python3 openai_agent_loop.py HOST:PORT

The model calls a tool (forced, so that the loop does not depend on what a tiny model says), the
client appends the SDK's own message object (content None, arguments as JSON text) and the tool's
result (role "tool" with tool_call_id), and asks again; the second turn must be served, streamed
and not, with the tool call and its result in the prompt. Run by python_clients_test.sh.
"""
import json
import sys

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "maxLength": 12}}}}}]


def main():
    client = OpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="none")
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=300, temperature=0.7, seed=2,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and len(choice.message.tool_calls) == 1, choice
    messages.append(choice.message)  # the SDK serializes it back: content null, arguments text
    for call in choice.message.tool_calls:
        city = json.loads(call.function.arguments)["city"]
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": json.dumps({"city": city, "celsius": 22})})
    final = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                           max_tokens=24, temperature=0.7, seed=5)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                    max_tokens=24, temperature=0.7, seed=5,
                                                    stream=True)
        if chunk.choices)
    answer = final.choices[0].message.content
    assert isinstance(answer, str) and answer == streamed, (answer, streamed)
    # The second prompt holds the first, the call and its result.
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    print("agent:", call.function.name, call.function.arguments, "->", final.choices[0].finish_reason)
    print("answer:", answer)


if __name__ == "__main__":
    main()
