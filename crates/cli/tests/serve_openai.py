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
