"""A real chat model's structured output at agent code's token limits, through the clients.

    python3 smollm2_structured.py HOST:PORT

Against a cluster serving SmolLM2-135M-Instruct: the openai SDK's forced get_weather call uses at
most 25 completion tokens, and LangChain's with_structured_output(method="function_calling")
returns the object at max_tokens=60.
"""
import sys

from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


class Weather(BaseModel):
    """The city whose weather is asked for."""

    city: str


def main():
    host = sys.argv[1]
    client = OpenAI(base_url=f"http://{host}/v1", api_key="none")
    model = client.models.list().data[0].id
    r = client.chat.completions.create(
        model=model, temperature=0, max_tokens=60, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    calls = r.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", r
    assert r.usage.completion_tokens <= 25, r.usage
    llm = ChatOpenAI(base_url=f"http://{host}/v1", api_key="none", model=model, temperature=0,
                     max_tokens=60)
    out = llm.with_structured_output(Weather, method="function_calling").invoke(
        "What is the weather in Paris?")
    assert isinstance(out, Weather) and out.city, out
    print(f"smollm2: forced call {calls[0].function.arguments} in {r.usage.completion_tokens} "
          f"tokens; with_structured_output -> {out!r}")


if __name__ == "__main__":
    main()
