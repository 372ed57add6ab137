"""Fuzz: 1,000 generated JSON schemas each compile or are refused cleanly, and what a compiled one yields
validates against it (jsonschema).

Schemas are what Hypothesis draws from the keywords xgrammar implements (type, properties, required,
additionalProperties, items, min/maxItems, min/maxLength, minimum/maximum, enum, const, anyOf): nested up to
8 leaves, half of them under an object, array or anyOf at the top, with bounds drawn independently so some
contradict each other (minimum > maximum, ...): those must be a GrammarError (the API's 400), never anything
else. About a quarter of the schemas also carry one thing inferd.engine.schema_check refuses (a keyword
xgrammar would compile without enforcing: `not`, `if`/`then`, `allOf` with two members, `uniqueItems`,
`contains`, `dependentRequired`, ...; a negative bound; a `required` name `properties` lacks), at the top or
inside a property: those must be a GrammarError naming that keyword, whatever else the schema holds.

Output comes from tests/engine/grammar_walk.py: seeded random logits under the grammar's mask, with a
bias toward closing tokens that grows with length (without it a random walk almost never closes a
string). Every token is still one the mask allowed, and the walk must end within 3,000 tokens. Length
and size bounds are drawn small (min/maxLength up to 8, min/maxItems up to 4), so walks stay short and the
whole test takes ~10 s on two cores. derandomize=True: CI sees the same 1,000 schemas.
"""
from __future__ import annotations

import json

import jsonschema
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferd.engine.grammar import GrammarError
from inferd.engine.sim.guided import sim_grammars
from inferd.engine.sim.profiles import sim_tokenizer
from inferd.types import GuidedDecoding
from tests.engine.grammar_walk import Walk

TOKENIZER = sim_tokenizer(4096)
GRAMMARS = sim_grammars(TOKENIZER)
WALK = Walk(TOKENIZER)
NAMES = st.sampled_from(["a", "b", "id", "name", "x_1", "tags", "Value", "n"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-50, 50), st.sampled_from(["", "a", "xy z", "q\"t"]))


def _bounded(draw, schema: dict, low: str, high: str, values) -> dict:
    if draw(st.booleans()):
        schema[low] = draw(values)
    if draw(st.booleans()):
        schema[high] = draw(values)
    return schema


@st.composite
def leaves(draw) -> dict:
    kind = draw(st.sampled_from(["null", "boolean", "integer", "number", "string", "enum", "const"]))
    if kind == "enum":
        return {"enum": draw(st.lists(SCALARS, min_size=0, max_size=4, unique_by=json.dumps))}
    if kind == "const":
        return {"const": draw(SCALARS)}
    schema: dict = {"type": kind}
    if kind in ("integer", "number"):
        return _bounded(draw, schema, "minimum", "maximum", st.integers(-20, 20))
    if kind == "string":
        return _bounded(draw, schema, "minLength", "maxLength", st.integers(0, 8))
    return schema


def containers(children: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
    @st.composite
    def array(draw) -> dict:
        return _bounded(draw, {"type": "array", "items": draw(children)}, "minItems", "maxItems", st.integers(0, 4))

    @st.composite
    def obj(draw) -> dict:
        props = draw(st.dictionaries(NAMES, children, max_size=4))
        schema: dict = {"type": "object", "properties": props}
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        if required:
            schema["required"] = required
        if draw(st.booleans()):
            schema["additionalProperties"] = False
        return schema

    any_of = st.lists(children, min_size=1, max_size=3).map(lambda options: {"anyOf": options})
    return st.one_of(array(), obj(), any_of)


NESTED = st.recursive(leaves(), containers, max_leaves=8)
SCHEMAS = st.one_of(NESTED, containers(NESTED))      # half of them an object, array or anyOf at the top

# (the keyword the refusal names, what is merged into a schema); each is refused by schema_check
POISONS = [
    ("not", {"not": {"type": "null"}}),
    ("if", {"if": {"type": "integer"}, "then": {"minimum": 1}}),
    ("allOf", {"allOf": [{"type": "integer"}, {"minimum": 1}]}),
    ("uniqueItems", {"uniqueItems": True}),
    ("contains", {"contains": {"type": "integer"}}),
    ("minContains", {"minContains": 1}),
    ("maxContains", {"maxContains": 2}),
    ("dependentRequired", {"dependentRequired": {"a": ["b"]}}),
    ("dependentSchemas", {"dependentSchemas": {"a": {"required": ["b"]}}}),
    ("dependencies", {"dependencies": {"a": ["b"]}}),
    ("minLength", {"minLength": -1}),
    ("maxItems", {"maxItems": -3}),
    ("required", {"type": "object", "properties": {}, "required": ["ghost"]}),
]


@st.composite
def refused_schemas(draw) -> tuple[dict, str]:
    """A generated schema with one poison merged in, at its top or as a property of an object around it."""
    keyword, poison = draw(st.sampled_from(POISONS))
    schema = {**draw(SCHEMAS), **poison}
    if draw(st.booleans()):
        schema = {"type": "object", "properties": {"p": schema}, "required": ["p"]}
    return schema, keyword


@st.composite
def cases(draw) -> tuple[dict, str | None]:
    """(schema, the keyword it must be refused for, or None): a quarter of them poisoned."""
    if draw(st.integers(0, 3)) == 3:
        return draw(refused_schemas())
    return draw(SCHEMAS), None


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases(), st.integers(0, 2**32 - 1))
def test_generated_schemas_compile_or_are_refused_and_output_validates(case, seed):
    schema, poison = case
    guided = GuidedDecoding(kind="json_schema", spec=json.dumps(schema, separators=(",", ":"), sort_keys=True))
    try:
        state = GRAMMARS.matcher(guided)
    except GrammarError as exc:
        assert str(exc)          # a clean refusal with a reason: the API's 400
        if poison is not None:   # refused for what it holds, before xgrammar saw it
            assert f"`{poison}`" in str(exc) and "at #" in str(exc), (poison, str(exc))
        event("refused (unenforced keyword)" if poison else "refused")
        return
    assert poison is None, f"{guided.spec} holds `{poison}`, which must be refused"
    event("compiled")
    text = WALK.text(state, seed)
    event(f"output of {len(text or '') // 20 * 20}+ characters")
    assert text is not None, f"no end within 3000 tokens for {guided.spec}"
    jsonschema.validate(json.loads(text), schema)
