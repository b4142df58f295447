"""Structured extraction with instructor (a pydantic model out of a chat completion), as its
users write it against an OpenAI-compatible server.

    python3 instructor_extract.py HOST:PORT

Mode.TOOLS (a forced function call whose arguments follow the model's JSON Schema) and
Mode.JSON_SCHEMA (response_format json_schema) must each give a validated Person on the first
try (max_retries=0: no re-asking hides a malformed answer). Run by python_clients_test.sh.
"""
import sys

import instructor
from openai import OpenAI
from pydantic import BaseModel, Field


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int
    happy: bool


def main():
    base = f"http://{sys.argv[1]}/v1"
    model = OpenAI(base_url=base, api_key="none").models.list().data[0].id
    messages = [{"role": "user", "content": "Tom is a happy boy of 7."}]
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(OpenAI(base_url=base, api_key="none"), mode=mode)
        for seed in (1, 2):
            person = client.chat.completions.create(
                model=model, response_model=Person, messages=messages, max_tokens=200,
                temperature=0.7, seed=seed, max_retries=0)
            assert isinstance(person, Person), person
            print(f"instructor {mode.value} seed {seed}: {person!r}")


if __name__ == "__main__":
    main()
