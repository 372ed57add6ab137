"""unenforced(): the schema keywords xgrammar compiles but does not enforce are found, with where they are;
the schemas it does enforce (what Pydantic and the OpenAI SDK write) pass."""
from __future__ import annotations

import pytest

from inferd.engine.schema_check import MAX_DEPTH, MAX_OPTIONAL, PATTERN_BUDGET_MS, unenforced


@pytest.mark.parametrize(("schema", "where", "says"), [
    ({"not": {}}, "#", "`not`"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "#", "`allOf`"),
    ({"type": "integer", "if": {"minimum": 0}, "then": {"maximum": -5}}, "#", "`if`"),
    ({"type": "array", "uniqueItems": True}, "#", "`uniqueItems`"),
    ({"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}}, "#", "`contains`"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "#", "`dependentRequired`"),
    ({"type": "string", "maxLength": -1}, "#", "`maxLength`"),
    ({"type": "object", "properties": {}, "required": ["a"]}, "#", "'a'"),
    ({"type": "object", "properties": {"a": {"anyOf": [{"type": "null"}, {"not": {"type": "string"}}]}}},
     "#/properties/a/anyOf/1", "`not`"),
    ({"$defs": {"d": {"type": "array", "items": {"uniqueItems": True}}}, "$ref": "#/$defs/d"},
     "#/$defs/d/items", "`uniqueItems`"),
])
def test_an_unenforced_keyword_is_named_with_where_it_is(schema, where, says):
    why = unenforced(schema)
    assert why is not None and why.startswith(f"at {where}:") and says in why, why


@pytest.mark.parametrize("schema", [
    {},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "required": ["a"],
     "additionalProperties": False},
    {"allOf": [{"$ref": "#/$defs/x"}], "$defs": {"x": {"type": "integer"}}},     # older Pydantic's single allOf
    {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}}, {"type": "null"}]},
    {"enum": [{"not": 1}, "if"]},            # const/enum values are data, not schemas
    {"type": "object", "properties": {"not": {"type": "integer"}, "if": {"type": "string"}}},
])
def test_what_xgrammar_enforces_passes(schema):
    assert unenforced(schema) is None


def nested(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_a_schema_nested_past_the_depth_bound_is_refused_before_its_slow_compile():
    assert unenforced(nested(MAX_DEPTH)) is None
    why = unenforced(nested(MAX_DEPTH + 1))
    assert why is not None and f"deeper than {MAX_DEPTH}" in why and why.startswith("at #/properties/a/")


def test_an_object_with_more_optional_properties_than_the_bound_is_refused_required_ones_are_not():
    names = [f"p{i}" for i in range(MAX_OPTIONAL + 1)]
    props = {name: {"type": "integer"} for name in names}
    why = unenforced({"type": "object", "properties": {"inner": {"type": "object", "properties": props}}})
    assert why is not None and why.startswith("at #/properties/inner:") and f"{MAX_OPTIONAL + 1} optional" in why
    assert unenforced({"type": "object", "properties": props, "required": names[:1]}) is None
    assert unenforced({"type": "object", "properties": props, "required": names}) is None


def test_patterns_past_their_compile_budget_are_refused_whether_one_big_or_many_small():
    assert unenforced({"type": "string", "pattern": "^[a-z]{0,100}$"}) is None
    assert unenforced({"type": "string", "pattern": "^[a-z]{0,10000}$"}) is not None     # ~5 s alone
    many = int(PATTERN_BUDGET_MS / 4) + 1
    why = unenforced({"anyOf": [{"type": "string", "pattern": f"^x{i}$"} for i in range(many)]})
    assert why is not None and "patterns" in why
    assert unenforced({"anyOf": [{"type": "string", "pattern": f"^x{i}$"} for i in range(many // 2)]}) is None
