import copy

import pytest

from vmcp_actors.workflows import coerce_arguments


def schema(**properties):
    return {"type": "object", "properties": properties}


def coerce_one(value, property_schema):
    return coerce_arguments({"v": value}, schema(v=property_schema))["v"]


# -- integers --------------------------------------------------------------------------


def test_a_string_integer_becomes_an_integer():
    assert coerce_one("5", {"type": "integer"}) == 5


def test_an_integral_decimal_string_becomes_an_integer():
    result = coerce_one("5.0", {"type": "integer"})
    assert result == 5 and isinstance(result, int)


def test_a_non_integral_string_is_left_for_an_integer():
    assert coerce_one("5.5", {"type": "integer"}) == "5.5"


def test_exponent_notation_becomes_an_integer_when_integral():
    assert coerce_one("1e3", {"type": "integer"}) == 1000


def test_surrounding_whitespace_is_ignored_for_numbers():
    assert coerce_one(" 7 ", {"type": "integer"}) == 7


def test_a_negative_integer_string_becomes_an_integer():
    assert coerce_one("-12", {"type": "integer"}) == -12


@pytest.mark.parametrize("text", ["abc", "1_000", "0x10", "", "5 apples", "nan", "inf"])
def test_strings_that_are_not_json_numbers_are_left_for_an_integer(text):
    assert coerce_one(text, {"type": "integer"}) == text


def test_an_integer_is_left_alone_for_an_integer():
    assert coerce_one(5, {"type": "integer"}) == 5


def test_an_integral_float_already_satisfies_integer_and_is_left_alone():
    result = coerce_one(5.0, {"type": "integer"})
    assert result == 5.0 and isinstance(result, float)


# -- numbers ---------------------------------------------------------------------------


def test_a_decimal_string_becomes_a_number():
    assert coerce_one("2.5", {"type": "number"}) == 2.5


def test_an_integer_string_becomes_an_int_for_number():
    result = coerce_one("5", {"type": "number"})
    assert result == 5 and isinstance(result, int)


@pytest.mark.parametrize("text", ["nan", "Infinity", "1e400"])
def test_non_finite_numbers_are_left_as_strings(text):
    assert coerce_one(text, {"type": "number"}) == text


# -- booleans --------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [("true", True), ("FALSE", False), ("True", True), ("1", True),
                                            ("0", False), (" false ", False)])
def test_boolean_words_and_digits_become_booleans(text, expected):
    assert coerce_one(text, {"type": "boolean"}) is expected


@pytest.mark.parametrize("text", ["yes", "no", "2", ""])
def test_other_strings_are_left_for_a_boolean(text):
    assert coerce_one(text, {"type": "boolean"}) == text


def test_an_integer_is_not_turned_into_a_boolean():
    assert coerce_one(1, {"type": "boolean"}) == 1


# -- strings ---------------------------------------------------------------------------


def test_a_number_becomes_its_text_for_a_string():
    assert coerce_one(42, {"type": "string"}) == "42"


def test_a_boolean_becomes_json_text_for_a_string():
    assert coerce_one(True, {"type": "string"}) == "true"


def test_an_object_becomes_compact_json_for_a_string():
    assert coerce_one({"a": [1, "é"]}, {"type": "string"}) == '{"a":[1,"é"]}'


def test_null_is_left_alone_for_a_string():
    assert coerce_one(None, {"type": "string"}) is None


def test_a_string_is_left_alone_for_a_string():
    assert coerce_one("5", {"type": "string"}) == "5"


# -- arrays and objects ----------------------------------------------------------------


def test_array_items_are_coerced():
    assert coerce_one(["1", "2"], {"type": "array", "items": {"type": "integer"}}) == [1, 2]


def test_a_json_string_becomes_an_array_and_its_items_are_coerced():
    assert coerce_one('["1", 2, "3.0"]', {"type": "array", "items": {"type": "integer"}}) == [1, 2, 3]


def test_a_string_that_is_not_a_json_array_is_left_for_an_array():
    assert coerce_one("a,b", {"type": "array"}) == "a,b"


def test_json_of_the_wrong_type_is_left_for_an_array():
    assert coerce_one('{"a": 1}', {"type": "array"}) == '{"a": 1}'


def test_nested_arrays_of_integers_are_coerced():
    nested = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
    assert coerce_one([["1", "2"], "[3, \"4\"]"], nested) == [[1, 2], [3, 4]]


def test_objects_with_booleans_inside_an_array_are_coerced():
    items = {"type": "array", "items": {"type": "object", "properties": {"on": {"type": "boolean"}}}}
    assert coerce_one([{"on": "true"}, {"on": "0"}], items) == [{"on": True}, {"on": False}]


def test_a_json_string_becomes_an_object_and_its_properties_are_coerced():
    obj = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}}}
    assert coerce_one('{"n": "3", "ok": "false"}', obj) == {"n": 3, "ok": False}


def test_properties_the_schema_does_not_describe_are_kept_as_they_are():
    assert coerce_arguments({"n": "1", "extra": "2"}, schema(n={"type": "integer"})) == {"n": 1, "extra": "2"}


def test_additional_properties_schema_coerces_undeclared_keys():
    obj = {"type": "object", "properties": {"name": {"type": "string"}},
           "additionalProperties": {"type": "integer"}}
    assert coerce_one({"name": "x", "a": "1", "b": "2"}, obj) == {"name": "x", "a": 1, "b": 2}


def test_prefix_items_coerce_by_position_and_items_the_rest():
    tuple_schema = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}],
                    "items": {"type": "integer"}}
    assert coerce_one([1, "true", "3", "4"], tuple_schema) == ["1", True, 3, 4]


def test_a_schema_without_type_but_with_properties_is_treated_as_an_object():
    assert coerce_arguments({"o": {"n": "2"}}, schema(o={"properties": {"n": {"type": "integer"}}})) == {"o": {"n": 2}}


# -- anyOf / oneOf / type lists ----------------------------------------------------------


def test_any_of_converts_to_the_first_alternative_that_fits():
    assert coerce_one("true", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}) is True
    assert coerce_one("5", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}) == 5


def test_any_of_leaves_a_value_one_alternative_already_accepts():
    assert coerce_one("5", {"anyOf": [{"type": "integer"}, {"type": "string"}]}) == "5"


def test_one_of_works_like_any_of():
    assert coerce_one("2.5", {"oneOf": [{"type": "boolean"}, {"type": "number"}]}) == 2.5


def test_any_of_respects_enums_when_deciding_what_fits():
    choice = {"anyOf": [{"type": "string", "enum": ["low", "high"]}, {"type": "integer"}]}
    assert coerce_one("5", choice) == 5
    assert coerce_one("low", choice) == "low"


def test_any_of_with_null_from_pydantic_optional_coerces_the_value():
    assert coerce_one("5", {"anyOf": [{"type": "integer"}, {"type": "null"}]}) == 5


def test_any_of_descends_into_the_object_alternative():
    choice = {"anyOf": [{"type": "object", "properties": {"n": {"type": "integer"}}}, {"type": "null"}]}
    assert coerce_one({"n": "4"}, choice) == {"n": 4}


def test_a_nullable_type_list_coerces_to_the_non_null_type():
    assert coerce_one("5", {"type": ["integer", "null"]}) == 5


def test_a_nullable_type_list_keeps_null():
    assert coerce_one(None, {"type": ["integer", "null"]}) is None


def test_the_text_null_becomes_null_when_no_earlier_type_fits():
    assert coerce_one("null", {"type": ["integer", "null"]}) is None


def test_a_nullable_string_keeps_the_text_null():
    assert coerce_one("null", {"type": ["string", "null"]}) == "null"


# -- $ref and allOf --------------------------------------------------------------------


def test_local_refs_are_followed():
    input_schema = {
        "type": "object",
        "$defs": {"Item": {"type": "object", "properties": {"qty": {"type": "integer"}}}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
    }
    assert coerce_arguments({"items": [{"qty": "2"}]}, input_schema) == {"items": [{"qty": 2}]}


def test_a_ref_to_itself_does_not_loop():
    input_schema = {"type": "object", "$defs": {"A": {"$ref": "#/$defs/A"}}, "properties": {"a": {"$ref": "#/$defs/A"}}}
    assert coerce_arguments({"a": "1"}, input_schema) == {"a": "1"}


def test_recursive_schemas_follow_the_value_depth():
    input_schema = {
        "type": "object",
        "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                            "next": {"$ref": "#/$defs/Node"}}}},
        "properties": {"head": {"$ref": "#/$defs/Node"}},
    }
    value = {"head": {"v": "1", "next": {"v": "2", "next": {"v": "3"}}}}
    assert coerce_arguments(value, input_schema) == {"head": {"v": 1, "next": {"v": 2, "next": {"v": 3}}}}


def test_a_remote_ref_is_not_followed():
    assert coerce_one("1", {"$ref": "https://example.com/schema.json"}) == "1"


def test_all_of_parts_are_applied():
    assert coerce_one("3", {"allOf": [{"type": "integer"}, {"minimum": 1}]}) == 3


# -- the contract ----------------------------------------------------------------------


def test_the_input_is_never_mutated():
    arguments = {"list": ["1", "2"], "obj": {"flag": "true"}, "json": '{"n": "1"}'}
    before = copy.deepcopy(arguments)
    input_schema = schema(
        list={"type": "array", "items": {"type": "integer"}},
        obj={"type": "object", "properties": {"flag": {"type": "boolean"}}},
        json={"type": "object", "properties": {"n": {"type": "integer"}}},
    )
    coerce_arguments(arguments, input_schema)
    assert arguments == before


def test_the_result_is_a_new_dict():
    arguments = {"a": "x"}
    assert coerce_arguments(arguments, schema(a={"type": "string"})) is not arguments


def test_a_missing_or_empty_schema_leaves_values_as_they_are():
    assert coerce_arguments({"n": "5"}, {}) == {"n": "5"}
    assert coerce_arguments({"n": "5"}, None) == {"n": "5"}


def test_a_property_without_a_type_is_left_as_it_is():
    assert coerce_arguments({"n": "5"}, schema(n={"description": "anything"})) == {"n": "5"}
