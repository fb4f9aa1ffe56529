"""Drives a running `vkdecode serve` (3 slots) with the `openai` Python package through
log-probabilities, n > 1, penalties, logit_bias and seeds (run by
crates/cli/tests/serve_sampling.rs: BASE_URL and API_KEY come in the environment).
Exits non-zero on any mismatch; prints a JSON object of what the Rust side checks."""
import json
import math
import os
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai

base = os.environ["BASE_URL"]
key = os.environ["API_KEY"]
client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
model = client.models.list().data[0].id
root = base.removesuffix("/v1")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def post(path, body):
    req = urllib.request.Request(
        root + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def metric(name):
    req = urllib.request.Request(root + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise SystemExit(f"no metric {name}")


def token_id(text):
    ids = post("/tokenize", {"content": text})["tokens"]
    assert len(ids) == 1, (text, ids)
    return ids[0]


logprob_requests = metric("vkdecode_logprob_requests_total")
constrained_requests = metric("vkdecode_constrained_requests_total")
results = {}

# chat logprobs, greedy: the chosen token is the best of its top list, probabilities sum
# to at most 1, the tokens spell the message, and the text is the plain greedy text
plain = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12,
                                       temperature=0)
r = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12,
                                   temperature=0, logprobs=True, top_logprobs=3)
assert plain.choices[0].logprobs is None, plain.choices[0].logprobs
msg = r.choices[0].message.content
assert msg == plain.choices[0].message.content, (msg, plain.choices[0].message.content)
content = r.choices[0].logprobs.content
assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
assert b"".join(bytes(t.bytes) for t in content).decode() == msg
for t in content:
    assert len(t.top_logprobs) == 3, t
    best = max(x.logprob for x in t.top_logprobs)
    assert t.logprob == best, (t.logprob, best)
    assert t.top_logprobs[0].token == t.token, t
    assert sum(math.exp(x.logprob) for x in t.top_logprobs) <= 1 + 1e-6, t
    assert all(x.logprob <= 0 for x in t.top_logprobs), t
results["chat_logprobs"] = [[t.token, t.logprob] for t in content]

# completions logprobs: the columns line up with the text
PROMPT = "The capital of France is"
c = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                              logprobs=2)
lp = c.choices[0].logprobs
text = c.choices[0].text
assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8, lp
assert "".join(lp.tokens) == text, (lp.tokens, text)
offsets = [0]
for t in lp.tokens[:-1]:
    offsets.append(offsets[-1] + len(t))
assert lp.text_offset == offsets, (lp.text_offset, offsets)
for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
    assert 1 <= len(top) <= 2 and tok in top and top[tok] == l == max(top.values()), (tok, l, top)

# echo: the text starts with the prompt
e = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                              echo=True)
assert e.choices[0].text == PROMPT + text, (e.choices[0].text, text)

# echo with logprobs (how evaluation harnesses score text): the prompt's tokens come
# first, the first with nothing to predict it; the answer's part is the plain request's
e = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0,
                              echo=True, logprobs=2)
elp = e.choices[0].logprobs
n_prompt = e.usage.prompt_tokens
assert e.choices[0].text == PROMPT + text, e.choices[0].text
assert len(elp.tokens) == n_prompt + 8, (n_prompt, elp.tokens)
assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None, elp
assert "".join(elp.tokens) == PROMPT + text, elp.tokens
assert elp.tokens[n_prompt:] == lp.tokens, (elp.tokens, lp.tokens)
# (the prompt went in a token at a time here: the same values within float noise)
for a, b in zip(elp.token_logprobs[n_prompt:], lp.token_logprobs):
    assert abs(a - b) < 0.02, (elp.token_logprobs, lp.token_logprobs)
for l, top in zip(elp.token_logprobs[1:], elp.top_logprobs[1:]):
    assert l <= 0 and 1 <= len(top) <= 2 and l <= max(top.values()) + 1e-6, (l, top)
assert elp.text_offset[:2] == [0, len(elp.tokens[0])], elp.text_offset
# scoring the prompt and the answer as one prompt gives the answer's values back (the
# prompt is fed a token at a time: within float noise of the decode kernels)
ids = post("/tokenize", {"content": PROMPT + text})["tokens"]
s = client.completions.create(model=model, prompt=ids, max_tokens=1, temperature=0, echo=True,
                              logprobs=1)
slp = s.choices[0].logprobs
assert slp.tokens[:n_prompt + 8] == elp.tokens, (slp.tokens, elp.tokens)
for a, b in zip(slp.token_logprobs[n_prompt:n_prompt + 8], lp.token_logprobs):
    assert abs(a - b) < 0.02, (slp.token_logprobs, lp.token_logprobs)
results["echo_scored"] = len(slp.tokens)

# streaming logprobs: the same tokens and values as the whole answer
streamed = []
parts = []
for chunk in client.chat.completions.create(model=model, messages=QUESTION, max_tokens=12,
                                            temperature=0, logprobs=True, top_logprobs=3,
                                            stream=True):
    for ch in chunk.choices:
        if ch.delta.content:
            parts.append(ch.delta.content)
        if ch.logprobs is not None and ch.logprobs.content:
            streamed.extend([t.token, t.logprob] for t in ch.logprobs.content)
assert "".join(parts) == msg, ("".join(parts), msg)
assert streamed == results["chat_logprobs"], (streamed, results["chat_logprobs"])
streamed = []
for chunk in client.completions.create(model=model, prompt=PROMPT, max_tokens=8,
                                       temperature=0, logprobs=2, stream=True):
    for ch in chunk.choices:
        if ch.logprobs is not None:
            streamed.extend(zip(ch.logprobs.tokens, ch.logprobs.token_logprobs,
                                ch.logprobs.text_offset))
assert streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset)), streamed

# n = 3: greedy choices are the n = 1 answer; sampled choices differ, choice 0 is the
# n = 1 answer with the same seed
g = client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0, n=3)
assert [ch.index for ch in g.choices] == [0, 1, 2], g.choices
assert all(ch.text == text for ch in g.choices), g.choices
assert g.usage.completion_tokens == 24, g.usage
# the prompt is prefilled once: choice 0 feeds what its slot does not hold (a question
# no slot has seen: only the template's system prefix is cached), the other two copy
# its K/V on the device and feed only the prompt's last token
ANIMAL = [{"role": "user", "content": "Name a large animal that lives in the sea."}]
prefilled = metric("vkdecode_prefilled_tokens_total")
s3 = client.chat.completions.create(model=model, messages=ANIMAL, max_tokens=24,
                                    temperature=1.0, seed=11, n=3)
texts = [ch.message.content for ch in s3.choices]
assert len(set(texts)) > 1, texts
fed = metric("vkdecode_prefilled_tokens_total") - prefilled
u = s3.usage
assert fed == u.prompt_tokens - u.prompt_tokens_details.cached_tokens + 2, (fed, u)
s1 = client.chat.completions.create(model=model, messages=ANIMAL, max_tokens=24,
                                    temperature=1.0, seed=11)
assert s1.choices[0].message.content == texts[0], (s1.choices[0].message.content, texts)
parts = {}
for chunk in client.chat.completions.create(model=model, messages=ANIMAL, max_tokens=24,
                                            temperature=1.0, seed=11, n=3, stream=True):
    for ch in chunk.choices:
        parts.setdefault(ch.index, []).append(ch.delta.content or "")
assert ["".join(parts[i]) for i in range(3)] == texts, (parts, texts)

# seeds: the same seed gives the same text, another seed another text
same = [client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24,
                                       temperature=1.0, seed=5).choices[0].message.content
        for _ in range(2)]
other = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24,
                                       temperature=1.0, seed=6).choices[0].message.content
assert same[0] == same[1], same
assert other != same[0], (other, same)

# penalties: a repetitive greedy continuation changes under a strong frequency penalty,
# and no token repeats more often than without it
LOOP = "one two three one two three one two three one two three"


def tokens(**kw):
    r = client.completions.create(model=model, prompt=LOOP, max_tokens=32, temperature=0,
                                  logprobs=0, **kw)
    return r.choices[0].text, r.choices[0].logprobs.tokens


base_text, base_toks = tokens()
pen_text, pen_toks = tokens(frequency_penalty=2.0)
assert pen_text != base_text, pen_text
assert max(Counter(pen_toks).values()) <= max(Counter(base_toks).values()), (pen_toks, base_toks)
pres_text, _ = tokens(presence_penalty=2.0)
assert pres_text != base_text, pres_text
rep_text, _ = tokens(extra_body={"repeat_penalty": 1.5})
assert rep_text != base_text, rep_text
results["penalties"] = [base_text, pen_text, pres_text, rep_text]

# logit_bias: -100 on the greedy first token bans it, +100 on another forces it
first = token_id(lp.tokens[0])
b = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0,
                              logprobs=0, logit_bias={str(first): -100})
assert b.choices[0].logprobs.tokens[0] != lp.tokens[0], b.choices[0].logprobs.tokens
banana = token_id(" banana")
f = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0,
                              logit_bias={str(banana): 100})
assert f.choices[0].text == " banana" * 4, f.choices[0].text
results["first"] = first
results["banana"] = banana

# out-of-range values are 400s naming the parameter
for kw, param in [
    (dict(frequency_penalty=2.5), "frequency_penalty"),
    (dict(presence_penalty=-3), "presence_penalty"),
    (dict(logit_bias={"1": 101}), "logit_bias"),
    (dict(logprobs=6), "logprobs"),
    (dict(n=0), "n"),
]:
    try:
        client.completions.create(model=model, prompt=PROMPT, max_tokens=1, **kw)
        raise SystemExit(f"{kw} was accepted")
    except openai.BadRequestError as err:
        assert err.body["param"] == param, (kw, err.body)
try:
    client.chat.completions.create(model=model, messages=QUESTION, max_tokens=1,
                                   logprobs=True, top_logprobs=21)
    raise SystemExit("top_logprobs 21 was accepted")
except openai.BadRequestError as err:
    assert err.body["param"] == "top_logprobs", err.body

# structured output while sampling: 5 seeds at temperature 1.0, every answer parses and
# validates against the schema (the jsonschema package); sent 3 at a time, so the
# server's 3 slots decode constrained requests side by side
person = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German"]}, "minItems": 1, "maxItems": 3},
        "employed": {"type": "boolean"},
        "email": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
    },
    "required": ["name", "age", "languages", "employed", "email"],
    "additionalProperties": False,
}
fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": person}}


def person_answer(seed):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Describe a person in JSON."}],
        max_tokens=120, temperature=1.0, seed=seed, response_format=fmt,
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", (seed, r.choices[0].finish_reason, text)
    jsonschema.validate(json.loads(text), person)
    return text


def cat_answer(seed):
    r = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "A cat, as JSON."}],
        max_tokens=120, temperature=1.0, seed=seed, response_format={"type": "json_object"},
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content


with ThreadPoolExecutor(max_workers=3) as pool:
    answers = set(pool.map(person_answer, range(5)))
    assert len(answers) > 1, answers
    # json_object: any object, at temperature 1.0 too
    list(pool.map(cat_answer, range(3)))
assert metric("vkdecode_constrained_requests_total") == constrained_requests + 8, metric(
    "vkdecode_constrained_requests_total")

# every request above with logprobs counted once
assert metric("vkdecode_logprob_requests_total") == logprob_requests + 11, metric(
    "vkdecode_logprob_requests_total")

print(json.dumps(results))
