"""An agent loop through LangChain (langchain-openai's ChatOpenAI), as LangChain users write one.

    python3 langchain_agent_loop.py HOST:PORT

bind_tools with the tool forced (so that the loop does not depend on what a tiny model says),
invoke, the tool run on the call's arguments, its result appended as a ToolMessage, and the next
turn invoked and streamed: the same text both ways, with the call and its result in the prompt.
Run by python_clients_test.sh.
"""
import json
import sys

from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import BaseModel, Field


class WeatherArgs(BaseModel):
    city: str = Field(max_length=12, description="The city")


@tool(args_schema=WeatherArgs)
def get_weather(city: str) -> str:
    """The weather in a city, now."""
    return json.dumps({"city": city, "celsius": 22})


def main():
    base = f"http://{sys.argv[1]}/v1"
    model = OpenAI(base_url=base, api_key="none").models.list().data[0].id

    def chat(max_tokens, seed):
        return ChatOpenAI(base_url=base, api_key="none", model=model, temperature=0.7,
                          max_tokens=max_tokens, seed=seed)

    messages = [HumanMessage("What is the weather in Paris?")]
    ai = chat(300, 2).bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
    assert len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather", ai
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = chat(24, 5).bind_tools([get_weather]).invoke(messages)
    assert isinstance(final.content, str) and final.content, final
    streamed = "".join(c.content for c in chat(24, 5).bind_tools([get_weather]).stream(messages))
    assert streamed == final.content, (streamed, final.content)
    print(f"langchain: called get_weather({ai.tool_calls[0]['args']}), then {final.content!r}")


if __name__ == "__main__":
    main()
