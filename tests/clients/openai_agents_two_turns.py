"""A two-turn conversation through the openai-agents SDK (`agents`), chained by the server.

    python3 openai_agents_two_turns.py HOST:PORT

An Agent on the Responses API (OpenAIResponsesModel over an AsyncOpenAI client, tracing off)
answers a first turn; the second turn sends only its new message and names the first answer as
previous_response_id (`Runner.run(..., previous_response_id=result.last_response_id)`), so the
router must rebuild the conversation from its stored response. The tiny model says nonsense;
what is checked is that both turns answer, that GET /v1/responses/{id} returns each stored
response with the second naming the first as previous_response_id, and that the second prompt
held the first turn (its input tokens exceed the first turn's input and output together).
Run by python_clients_test.sh.
"""
import asyncio
import sys

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI


def check(condition, what):
    if not condition:
        raise AssertionError(what)


async def main():
    set_tracing_disabled(True)  # nothing goes to OpenAI's trace exporter
    client = AsyncOpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="none")
    model = (await client.models.list()).data[0].id
    agent = Agent(name="Storyteller", instructions="You tell short stories.",
                  model=OpenAIResponsesModel(model=model, openai_client=client),
                  model_settings=ModelSettings(max_tokens=24, temperature=0.7,
                                               extra_body={"seed": 5}))

    first = await Runner.run(agent, "Tell me a story about a cat.")
    check(isinstance(first.final_output, str) and first.final_output.strip(),
          f"the first turn has no final output: {first.final_output!r}")
    first_id = first.last_response_id
    check(isinstance(first_id, str) and first_id.startswith("resp_"),
          f"the first turn has no response id: {first_id!r}")

    second = await Runner.run(agent, "And then what happened?", previous_response_id=first_id)
    check(isinstance(second.final_output, str) and second.final_output.strip(),
          f"the second turn has no final output: {second.final_output!r}")
    second_id = second.last_response_id
    check(isinstance(second_id, str) and second_id.startswith("resp_") and second_id != first_id,
          f"the second turn's response id {second_id!r} (the first's {first_id!r})")

    stored_first = await client.responses.retrieve(first_id)
    stored_second = await client.responses.retrieve(second_id)
    check(stored_first.id == first_id and stored_first.previous_response_id is None,
          f"GET of the first response: {stored_first}")
    check(stored_second.id == second_id and stored_second.previous_response_id == first_id,
          f"GET of the second response does not name the first: {stored_second}")
    check(stored_first.output_text == first.final_output,
          f"stored {stored_first.output_text!r}, the SDK's {first.final_output!r}")
    check(stored_second.output_text == second.final_output,
          f"stored {stored_second.output_text!r}, the SDK's {second.final_output!r}")
    u1, u2 = stored_first.usage, stored_second.usage
    check(u1.input_tokens > 0 and u1.output_tokens > 0, f"the first usage: {u1}")
    # The second prompt: the instructions, the first message and answer, then the new message.
    check(u2.input_tokens > u1.input_tokens + u1.output_tokens,
          f"the second prompt does not hold the first turn: {u2} after {u1}")
    check(second.raw_responses[-1].usage.input_tokens == u2.input_tokens,
          f"the SDK's usage {second.raw_responses[-1].usage} differs from the stored {u2}")
    print(f"agents two turns: {first_id} -> {second_id} (previous_response_id), input tokens "
          f"{u1.input_tokens}+{u1.output_tokens} -> {u2.input_tokens}:",
          repr(first.final_output), "/", repr(second.final_output))


if __name__ == "__main__":
    asyncio.run(main())
