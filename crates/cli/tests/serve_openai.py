"""Drives a running `vkdecode serve` with the `openai` Python package (run by
crates/cli/tests/serve_openai.rs with the test venv's python: BASE_URL, API_KEY and
the expected greedy texts come in the environment). Exits non-zero on any mismatch."""
import json
import os
import sys

import openai

base = os.environ["BASE_URL"]
key = os.environ["API_KEY"]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)

models = client.models.list()
model = models.data[0].id
assert model == "SmolLM2-135M-Instruct.Q8_0", model

results = {}

# chat, whole
r = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=16,
    temperature=0,
)
assert r.object == "chat.completion", r
assert r.choices[0].message.role == "assistant"
assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason
assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 0, r.usage
assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
results["chat"] = r.choices[0].message.content

# chat, streamed: the same text as whole, one finish_reason, usage at the end
parts, finishes, usage = [], [], None
stream = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "What is the capital of France?"}],
    max_tokens=16,
    temperature=0,
    stream=True,
    stream_options={"include_usage": True},
)
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finishes.append(c.finish_reason)
assert "".join(parts) == results["chat"], ("".join(parts), results["chat"])
assert len(finishes) == 1, finishes
assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage

# completions, whole: max_tokens reached is "length"
c = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0
)
assert c.object == "text_completion"
assert c.choices[0].finish_reason == "length", c.choices[0].finish_reason
assert c.usage.completion_tokens == 8, c.usage
results["completion"] = c.choices[0].text

# completions, streamed
parts = []
for chunk in client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True
):
    for ch in chunk.choices:
        parts.append(ch.text)
assert "".join(parts) == results["completion"], ("".join(parts), results["completion"])

# a stop string ends the text before it, with "stop"
s = client.completions.create(
    model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
    stop=[results["completion"][3:6]],
)
assert s.choices[0].finish_reason == "stop", s.choices[0]
assert s.choices[0].text == results["completion"][:3], (s.choices[0].text, results["completion"])

# sampling with a seed is reproducible
a = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8,
                              temperature=0.9, top_p=0.9, seed=42)
b = client.completions.create(model=model, prompt="Once upon a time", max_tokens=8,
                              temperature=0.9, top_p=0.9, seed=42)
assert a.choices[0].text == b.choices[0].text, (a.choices[0].text, b.choices[0].text)

# structured output: a JSON schema holds the answer to it (strict), streamed or not
city_schema = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "country": {"enum": ["France", "Germany", "Italy"]},
        "population": {"type": "integer", "minimum": 0, "maximum": 100},
    },
    "required": ["name", "country", "population"],
    "additionalProperties": False,
}
city_messages = [{"role": "user", "content": os.environ["CITY_PROMPT"]}]
fmt = {"type": "json_schema", "json_schema": {"name": "city", "strict": True, "schema": city_schema}}
r = client.chat.completions.create(
    model=model, messages=city_messages, max_tokens=60, temperature=0, response_format=fmt
)
text = r.choices[0].message.content
assert r.choices[0].finish_reason == "stop", (r.choices[0].finish_reason, text)
city = json.loads(text)
assert list(city) == ["name", "country", "population"], text
assert city["country"] in ("France", "Germany", "Italy") and 0 <= city["population"] <= 100, city
results["json_schema"] = text
parts = []
for chunk in client.chat.completions.create(
    model=model, messages=city_messages, max_tokens=60, temperature=0, response_format=fmt,
    stream=True,
):
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
assert "".join(parts) == text, ("".join(parts), text)

# what structured-output code writes: a pydantic model, parsed by the package
import pydantic


class Answer(pydantic.BaseModel):
    city: str
    is_capital: bool
    rank: int


parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
r = parse(
    model=model,
    messages=[{"role": "user", "content": "Is Paris the capital of France? Answer in JSON."}],
    max_tokens=60,
    temperature=0,
    response_format=Answer,
)
answer = r.choices[0].message.parsed
assert isinstance(answer, Answer), r.choices[0].message

# any JSON object
r = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=40,
    temperature=0.7, seed=1, response_format={"type": "json_object"},
)
if r.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content
else:
    assert r.choices[0].message.content.lstrip().startswith("{"), r.choices[0].message.content

# llama-server's grammar field, on completions
r = client.completions.create(
    model=model, prompt="Is the sky green? Answer:", max_tokens=8, temperature=0,
    extra_body={"grammar": 'root ::= " " ("yes" | "no") "."'},
)
assert r.choices[0].text in (" yes.", " no."), r.choices[0].text
assert r.choices[0].finish_reason == "stop", r.choices[0]

# a keyword the grammar cannot enforce, and a grammar that does not compile: 400 naming it
for extra, param, needle in [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "^a+$"}}}}, "response_format", "pattern"),
    ({"extra_body": {"grammar": "root ::= missing"}}, "grammar", "missing"),
]:
    try:
        client.chat.completions.create(model=model, messages=city_messages, max_tokens=4, **extra)
        raise SystemExit(f"{param} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == param and needle in e.body["message"], e.body

# tools: a forced call (a named function, or "required") always parses and follows the
# function's parameters; the follow-up with the tool's result is accepted
weather = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
clock = {"type": "function", "function": {"name": "get_time", "description": "The time now", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
for choice in [{"type": "function", "function": {"name": "get_weather"}}, "required"]:
    r = client.chat.completions.create(
        model=model, messages=ask, max_tokens=60, temperature=0, tools=[weather, clock], tool_choice=choice
    )
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", (choice, r.choices[0])
    assert m.content is None and len(m.tool_calls) == 1, m
    call = m.tool_calls[0]
    assert call.type == "function" and call.id, call
    if choice != "required":
        assert call.function.name == "get_weather", call
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert list(args) == ["city", "unit"] and args["unit"] in ("celsius", "fahrenheit"), args
    else:
        assert args == {}, args
results["tool_call"] = [call.function.name, call.function.arguments]
# auto: the model chooses; either a call that parses or a plain answer, never a mix
for tools_given in ([weather, clock], [weather]):
    r = client.chat.completions.create(
        model=model, messages=ask, max_tokens=60, temperature=0, tools=tools_given, tool_choice="auto"
    )
    m = r.choices[0].message
    if m.tool_calls:
        assert r.choices[0].finish_reason == "tool_calls" and m.content is None, r.choices[0]
        json.loads(m.tool_calls[0].function.arguments)
    else:
        assert m.content and r.choices[0].finish_reason in ("stop", "length"), r.choices[0]
# streamed: the same call, in one delta
calls, finishes = [], []
for chunk in client.chat.completions.create(
    model=model, messages=ask, max_tokens=60, temperature=0, tools=[weather, clock],
    tool_choice="required", stream=True,
):
    for c in chunk.choices:
        if c.delta.tool_calls:
            calls.extend(c.delta.tool_calls)
        if c.finish_reason:
            finishes.append(c.finish_reason)
assert finishes == ["tool_calls"], finishes
assert [(c.function.name, c.function.arguments) for c in calls] == [tuple(results["tool_call"])], calls
# the follow-up: the assistant's call and the tool's answer in the history
follow = ask + [
    {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
]
r = client.chat.completions.create(
    model=model, messages=follow, max_tokens=24, temperature=0, tools=[weather, clock], tool_choice="none"
)
assert r.choices[0].message.content and not r.choices[0].message.tool_calls, r.choices[0].message
assert r.choices[0].finish_reason in ("stop", "length"), r.choices[0]
# a named function that is not among the tools: 400 naming tool_choice
try:
    client.chat.completions.create(model=model, messages=ask, tools=[weather],
                                   tool_choice={"type": "function", "function": {"name": "nope"}})
    raise SystemExit("an unknown function was accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "tool_choice", e.body

# errors surface as the package's exceptions with the status
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    raise SystemExit("an unknown model was accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404
try:
    client.completions.create(model=model, prompt="x", max_tokens=0)
    raise SystemExit("max_tokens 0 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
try:
    openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
    raise SystemExit("a wrong key was accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

print(json.dumps(results))
