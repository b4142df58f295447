"""Tandem's OpenAI-compatible HTTP API through the official `openai` client (pip install openai).

    python3 openai_client.py HOST:PORT [API_KEY]

Asks one chat question, streams a completion, asks for JSON that fits a schema (structured
output) and forces a tool call. The README shows this file; a test runs it against a real
cluster (tests/clients/python_clients_test.sh).
"""
import json
import sys

from openai import OpenAI


def main():
    address = sys.argv[1]
    api_key = sys.argv[2] if len(sys.argv) > 2 else "none"  # any string without --api-keys-file
    client = OpenAI(base_url=f"http://{address}/v1", api_key=api_key)
    model = client.models.list().data[0].id  # the one model served

    chat = client.chat.completions.create(
        model=model, max_tokens=32, temperature=0.8, seed=1,
        messages=[{"role": "user", "content": "Tell me a story about the sea."}])
    print("chat:", chat.choices[0].message.content)

    print("completion: ", end="")
    for chunk in client.completions.create(model=model, prompt="The old lighthouse",
                                           max_tokens=24, temperature=0.8, seed=7, stream=True):
        print(chunk.choices[0].text, end="", flush=True)
    print()

    # Structured output: the answer is one JSON value that fits the schema.
    schema = {"type": "object", "required": ["name", "age"],
              "properties": {"name": {"type": "string", "maxLength": 16},
                             "age": {"type": "integer"}}}
    reply = client.chat.completions.create(
        model=model, max_tokens=300, temperature=0.8, seed=3,
        messages=[{"role": "user", "content": "Describe the lighthouse keeper as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "keeper", "schema": schema}})
    print("json:", json.dumps(json.loads(reply.choices[0].message.content)))

    # A forced tool call: the arguments fit the function's parameters.
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {
            "type": "object", "required": ["city"],
            "properties": {"city": {"type": "string", "maxLength": 16}}}}}]
    message = client.chat.completions.create(
        model=model, max_tokens=300, temperature=0.8, seed=4, tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather at sea?"}]).choices[0].message
    call = message.tool_calls[0].function
    print("tool:", call.name, json.dumps(json.loads(call.arguments)))


if __name__ == "__main__":
    main()
