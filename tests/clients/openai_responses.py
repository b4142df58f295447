"""The Responses API (/v1/responses) through the official `openai` client's `responses.create`.

    python3 openai_responses.py HOST:PORT

Plain text, then the same request streamed (its deltas make the same text); a tool loop: a forced
function call (also through the SDK's `responses.stream` helper, which rebuilds the response from
the events and so checks their order), the call and its `function_call_output` sent back as
input items, then the answer. The tiny model says nonsense; what is checked is the shape of
every answer and that each turn reaches the model. Run by python_clients_test.sh.
"""
import json
import sys

from openai import OpenAI

TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city, now.",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"type": "string", "maxLength": 12}}}}]


def check_usage(response):
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0, usage
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens, usage


def main():
    client = OpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="none")
    model = client.models.list().data[0].id
    story = dict(model=model, input="Tell me a story", instructions="You tell stories.",
                 max_output_tokens=24, temperature=0.7, extra_body={"seed": 5})

    plain = client.responses.create(**story)
    assert plain.object == "response" and plain.id.startswith("resp_"), plain
    assert plain.status in ("completed", "incomplete"), plain
    assert plain.output[0].type == "message" and plain.output[0].role == "assistant", plain
    text = plain.output_text
    assert isinstance(text, str) and text, plain
    check_usage(plain)

    types, deltas, final = [], [], None
    for event in client.responses.create(stream=True, **story):
        types.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert "response.output_text.done" in types and "response.output_item.done" in types, types
    assert "".join(deltas) == text, (deltas, text)
    assert final is not None and final.output_text == text, final

    # The agent loop: a forced call, its output, the answer.
    question = {"role": "user", "content": "What is the weather in Paris?"}
    forced = dict(model=model, input=[question], tools=TOOLS, max_output_tokens=300,
                  temperature=0.7, tool_choice={"type": "function", "name": "get_weather"},
                  extra_body={"seed": 2})
    first = client.responses.create(**forced)
    assert first.status == "completed", first
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", first.output
    call = calls[0]
    city = json.loads(call.arguments)["city"]
    assert isinstance(city, str), call

    with client.responses.stream(**forced) as stream:
        arguments = "".join(e.delta for e in stream
                            if e.type == "response.function_call_arguments.delta")
        streamed = stream.get_final_response()
    assert arguments == call.arguments, (arguments, call.arguments)
    assert [(i.type, i.name, i.arguments) for i in streamed.output] == [
        ("function_call", "get_weather", call.arguments)], streamed.output

    turn = [question, *first.output,  # the SDK's own output items, sent back
            {"type": "function_call_output", "call_id": call.call_id,
             "output": json.dumps({"city": city, "celsius": 22})}]
    answer = client.responses.create(model=model, input=turn, tools=TOOLS, max_output_tokens=24,
                                     temperature=0.7, extra_body={"seed": 5})
    assert answer.status in ("completed", "incomplete"), answer
    assert answer.output, answer
    check_usage(answer)
    # The second prompt holds the first, the call and its result.
    assert answer.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, (
        answer.usage, first.usage)
    print("responses:", repr(text))
    print("responses agent:", call.name, call.arguments, "->", answer.status,
          repr(answer.output_text))


if __name__ == "__main__":
    main()
