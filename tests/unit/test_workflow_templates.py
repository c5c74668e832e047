import copy

import pytest

from vmcp_actors.workflows import (
    ForEachItem,
    StepOutcome,
    TemplateRenderError,
    TemplateSyntaxError,
    UnsafeTemplate,
    compile_template,
    is_template,
    iter_templates,
    referenced_steps,
    render_condition,
    render_value,
    template_context,
)


@pytest.fixture
def context():
    return template_context(
        params={"issue": 42, "name": 'say "hi"', "flag": True, "labels": ["bug", "ui"]},
        steps={
            "fetch": StepOutcome("completed", {"title": "Crash", "items": ["x"], "meta": {"n": 1}, "none": None}),
            "broken": StepOutcome("failed", error="backend 'jira' timed out"),
        },
        workflow_id="run-1",
    )


def render(source, context):
    return compile_template(source).render(context)


# -- whole value or text ---------------------------------------------------------------


def test_a_whole_value_template_yields_the_native_number(context):
    assert render("{{ params.issue }}", context) == 42


def test_a_whole_value_template_passes_a_nested_structure_through(context):
    assert render("{{ steps.fetch.output.meta }}", context) == {"n": 1}


def test_a_whole_value_result_is_a_copy_of_the_context_data(context):
    result = render("{{ steps.fetch.output }}", context)
    result["meta"]["n"] = 99
    assert context["steps"]["fetch"]["output"]["meta"] == {"n": 1}


def test_a_single_trailing_newline_still_counts_as_a_whole_value(context):
    assert render("{{ params.issue }}\n", context) == 42


def test_surrounding_spaces_make_it_text(context):
    assert render(" {{ params.issue }}", context) == " 42"


def test_mixed_text_renders_to_a_string(context):
    assert render("Issue #{{ params.issue }}: {{ steps.fetch.output.title }}", context) == "Issue #42: Crash"


def test_non_string_values_in_text_are_written_as_compact_json(context):
    rendered = render("{{ params.flag }} {{ steps.fetch.output.none }} {{ steps.fetch.output.meta }}!", context)
    assert rendered == 'true null {"n":1}!'


def test_iterables_from_filters_become_lists_in_a_whole_value(context):
    assert render("{{ params.labels | map('upper') }}", context) == ["BUG", "UI"]


def test_non_string_mapping_keys_become_json_keys(context):
    assert render("{{ {1: 'a', none: 'b'} }}", context) == {"1": "a", "null": "b"}


def test_a_value_that_is_not_json_data_is_an_error_not_a_repr(context):
    with pytest.raises(TemplateRenderError, match="Cycler value, which is not JSON data"):
        render("{{ cycler(1, 2) }}", context)


def test_strings_without_template_markers_are_not_templates(context):
    assert render_value("see {#anchor} and {x}", context) == "see {#anchor} and {x}"
    assert not is_template("{#anchor}")


# -- ToolHive's Go path form ---------------------------------------------------------------


def test_go_path_form_reads_a_param(context):
    assert render("{{.params.issue}}", context) == 42


def test_go_path_form_with_spaces_reads_a_step_output(context):
    assert render("{{ .steps.fetch.output.title }}", context) == "Crash"


def test_go_path_form_inside_text(context):
    assert render("#{{.params.issue}} by {{.workflow.id}}", context) == "#42 by run-1"


def test_go_trim_markers_are_kept(context):
    assert render("a  {{- .params.issue -}}  b", context) == "a42b"


def test_go_json_function_becomes_tojson(context):
    assert render("{{json .steps.fetch.output.meta}}", context) == '{"n":1}'


def test_go_quote_function_becomes_quote(context):
    assert render("{{quote .params.name}}", context) == '"say \\"hi\\""'


def test_go_pipe_to_json(context):
    assert render("{{ .params.labels | json }}", context) == '["bug","ui"]'


def test_go_path_reads_a_data_key_named_like_a_method(context):
    assert render("{{.steps.fetch.output.items}}", context) == ["x"]


def test_jinja_attribute_reads_a_data_key_named_like_a_method(context):
    assert render("{{ steps.fetch.output.items }}", context) == ["x"]


def test_go_control_actions_are_a_syntax_error_with_the_supported_forms():
    with pytest.raises(TemplateSyntaxError, match=r"line 2: Go-template action \{\{ if \}\} is not supported") as err:
        compile_template("ok\n{{ if .params.flag }}yes{{ end }}")
    assert "{{json .path}}" in str(err.value)


def test_other_go_syntax_errors_mention_the_supported_forms():
    with pytest.raises(TemplateSyntaxError, match="only .* are supported"):
        compile_template('{{ eq .params.x "a" }}')


# -- context ---------------------------------------------------------------------------


def test_steps_expose_status_and_error(context):
    assert render("{{ steps.broken.status }}: {{ steps.broken.error }}", context) == \
        "failed: backend 'jira' timed out"


def test_a_completed_step_has_a_null_error(context):
    assert render("{{ steps.fetch.error }}", context) is None


def test_for_each_exposes_the_item_under_its_variable_and_the_index():
    context = template_context(params={}, steps={}, workflow_id="w",
                               for_each=ForEachItem({"name": "openssl"}, 3, item_var="pkg"))
    assert render("{{ forEach.pkg.name }}#{{ forEach.index }}", context) == "openssl#3"


def test_for_each_item_variable_defaults_to_item():
    context = template_context(params={}, steps={}, workflow_id="w", for_each=ForEachItem("a", 0))
    assert render("{{.forEach.item}}", context) == "a"


def test_for_each_item_variable_cannot_be_index():
    with pytest.raises(ValueError, match="cannot be 'index'"):
        template_context(params={}, steps={}, workflow_id="w", for_each=ForEachItem("a", 0, item_var="index"))


def test_an_undefined_param_is_a_render_error_naming_it(context):
    with pytest.raises(TemplateRenderError, match="has no attribute 'missing'"):
        render("{{ params.missing }}", context)


def test_a_step_that_has_not_run_is_undefined(context):
    with pytest.raises(TemplateRenderError, match="has no attribute 'later'"):
        render("{{ steps.later.output }}", context)


def test_an_undefined_value_inside_a_whole_value_list_is_an_error(context):
    with pytest.raises(TemplateRenderError, match="missing"):
        render("{{ [params.missing] }}", context)


def test_a_python_exception_in_a_template_becomes_a_render_error(context):
    with pytest.raises(TemplateRenderError, match="ZeroDivisionError"):
        render("{{ 1 / 0 }}", context)


# -- filters ---------------------------------------------------------------------------


def test_tojson_is_compact_and_keeps_non_ascii(context):
    assert render("{{ {'a': [1, 2], 'b': 'é'} | tojson }}", context) == '{"a":[1,2],"b":"é"}'


def test_fromjson_parses_a_json_string(context):
    assert render("{{ '{\"a\": [1]}' | fromjson }}", context) == {"a": [1]}


def test_fromjson_of_invalid_json_is_a_render_error(context):
    with pytest.raises(TemplateRenderError, match="fromjson: not valid JSON"):
        render("{{ 'nope' | fromjson }}", context)


def test_quote_makes_a_json_string_literal(context):
    assert render("{{ params.name | quote }}", context) == '"say \\"hi\\""'


def test_quote_of_a_non_string_quotes_its_json(context):
    assert render("{{ params.labels | quote }}", context) == '"[\\"bug\\",\\"ui\\"]"'


# -- compiling -------------------------------------------------------------------------


def test_a_syntax_error_gives_the_line():
    with pytest.raises(TemplateSyntaxError) as err:
        compile_template("first line\nsecond {{ oops(\n")
    assert err.value.line == 2
    assert str(err.value).startswith("template syntax error at line 2:")
    assert err.value.source == "first line\nsecond {{ oops(\n"


def test_compiled_templates_are_cached():
    assert compile_template("{{ params.a }}") is compile_template("{{ params.a }}")


def test_a_single_expression_yields_its_value_and_text_around_it_yields_text():
    context = template_context(params={"a": {"k": [1, 2]}}, steps={}, workflow_id="w")
    assert compile_template("{{ params.a }}").render(context) == {"k": [1, 2]}
    assert compile_template("a {{ params.a }}").render(context) != {"k": [1, 2]}


# -- render_value ----------------------------------------------------------------------


def test_render_value_renders_templates_inside_nested_arguments(context):
    arguments = {"query": "{{ steps.fetch.output.title }}", "filter": {"ids": ["{{ params.issue }}", 7]},
                 "limit": 5, "strict": False, "note": None}
    assert render_value(arguments, context) == {"query": "Crash", "filter": {"ids": [42, 7]},
                                                "limit": 5, "strict": False, "note": None}


def test_render_value_does_not_render_keys(context):
    assert render_value({"{{ params.issue }}": 1}, context) == {"{{ params.issue }}": 1}


def test_render_value_does_not_mutate_its_input(context):
    arguments = {"a": ["{{ params.issue }}", {"b": "{{ params.flag }}"}]}
    before = copy.deepcopy(arguments)
    render_value(arguments, context)
    assert arguments == before


def test_render_value_errors_name_the_location(context):
    with pytest.raises(TemplateRenderError) as err:
        render_value({"filter": {"ids": ["ok", "{{ params.nope }}"]}}, context)
    assert err.value.location == "filter.ids[1]"
    assert str(err.value).startswith("filter.ids[1]: ")


def test_iter_templates_lists_every_template_with_its_location():
    found = list(iter_templates({"a": "{{ x }}", "b": ["plain", "{% if y %}1{% endif %}"], "c": 3}))
    assert found == [("a", "{{ x }}"), ("b[1]", "{% if y %}1{% endif %}")]


# -- conditions ------------------------------------------------------------------------


def test_a_condition_may_render_a_boolean(context):
    assert render_condition("{{ params.issue > 40 }}", context) is True


def test_a_condition_may_render_true_or_false_text_in_any_case(context):
    assert render_condition("{% if params.flag %}TRUE{% else %}false{% endif %}", context) is True
    assert render_condition("False", context) is False


def test_a_condition_ignores_surrounding_whitespace(context):
    assert render_condition("\n  {{ 'true' }}  \n", context) is True


def test_a_condition_with_another_result_is_an_error(context):
    with pytest.raises(TemplateRenderError, match="must render to true or false, got 'yes'"):
        render_condition("yes", context)


def test_a_condition_rendering_a_number_is_an_error(context):
    with pytest.raises(TemplateRenderError, match="got 42"):
        render_condition("{{ params.issue }}", context)


def test_a_go_path_condition_works(context):
    assert render_condition("{{.params.flag}}", context) is True


# -- referenced_steps ------------------------------------------------------------------


def test_referenced_steps_finds_attribute_and_subscript_access():
    assert referenced_steps("{{ steps.a.output.x }} {{ steps['b'].output }}") == {"a", "b"}


def test_referenced_steps_finds_go_path_form():
    assert referenced_steps("{{.steps.a.output.x}} {{json .steps.b.output}}") == {"a", "b"}


def test_referenced_steps_finds_steps_in_statements():
    assert referenced_steps("{% if steps.a.status == 'failed' %}{{ steps.b.output }}{% endif %}") == {"a", "b"}


def test_referenced_steps_output_only_leaves_out_status_and_error():
    source = "{{ steps.a.status }} {{ steps.b.error }} {{ steps.c.output }} {{ steps.d }}"
    assert referenced_steps(source, output_only=True) == {"c", "d"}


def test_referenced_steps_ignores_dynamic_access():
    assert referenced_steps("{{ steps[params.which].output }} {{ steps | tojson }}") == set()


def test_referenced_steps_of_plain_text_is_empty():
    assert referenced_steps("steps.a.output") == set()


def test_referenced_steps_raises_on_a_syntax_error():
    with pytest.raises(TemplateSyntaxError):
        referenced_steps("{{ steps.a.output ")


# -- sandbox: Python internals ---------------------------------------------------------


@pytest.mark.parametrize("source, refused", [
    ("{{ ''.__class__ }}", "__class__"),
    ("{{ params.__init__ }}", "__init__"),
    ("{{ cycler.__init__.__globals__ }}", "__init__"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "__class__"),
    ("{{ steps['__class__'] }}", "__class__"),
    ("{{ namespace.__init__.__globals__['os'] }}", "__init__"),
])
def test_dunder_attributes_are_refused_at_compile_time(source, refused):
    with pytest.raises(UnsafeTemplate, match=f"refused: attribute '{refused}' reaches Python internals"):
        compile_template(source)


def test_dunder_attributes_through_the_attr_filter_are_refused_at_render(context):
    with pytest.raises(UnsafeTemplate, match="'__class__' of 'dict' object is unsafe"):
        render("{{ params | attr('__class__') }}", context)


def test_private_attributes_are_refused_at_render(context):
    with pytest.raises(UnsafeTemplate, match="_TemplateReference__context"):
        render("{{ self._TemplateReference__context }}", context)


def test_internal_attributes_of_generators_are_refused(context):
    with pytest.raises(UnsafeTemplate, match="'gi_frame' of 'generator' object is unsafe"):
        render("{{ (params.labels | map('upper')).gi_frame }}", context)


def test_templates_cannot_mutate_the_data_they_read(context):
    with pytest.raises(UnsafeTemplate, match="'append' of 'list' object is unsafe"):
        render("{{ params.labels.append('x') }}", context)
    assert context["params"]["labels"] == ["bug", "ui"]


@pytest.mark.parametrize("source", ["{% include 'x.txt' %}", "{% import 'm' as m %}", "{% extends 'base' %}",
                                    "{% from 'm' import x %}"])
def test_templates_cannot_reach_other_templates_or_files(source):
    with pytest.raises(UnsafeTemplate, match="cannot include, import or extend"):
        compile_template(source)


def test_lipsum_is_not_available(context):
    with pytest.raises(TemplateRenderError, match="'lipsum' is undefined"):
        render("{{ lipsum(1000000) }}", context)


# -- sandbox: resources ----------------------------------------------------------------


def test_a_huge_range_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="range"):
        render("{{ range(10**9) | length }}", context)


def test_nested_ranges_share_one_budget_per_render(context):
    with pytest.raises(UnsafeTemplate, match="range"):
        render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", context)


def test_the_range_budget_is_fresh_for_every_render(context):
    template = compile_template("{% for i in range(60000) %}{% endfor %}done")
    assert template.render(context) == "done"
    assert template.render(context) == "done"


def test_string_repetition_beyond_the_limit_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="'\\*' result length"):
        render("{{ 'a' * 10**9 }}", context)


def test_list_repetition_beyond_the_limit_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="'\\*' result length"):
        render("{{ params.labels * 10**8 }}", context)


def test_a_huge_power_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="'\\*\\*' result size"):
        render("{{ 10 ** 100000 }}", context)


def test_a_huge_printf_width_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="format width"):
        render("{{ '%0999999999d' % 1 }}", context)


def test_a_huge_str_format_width_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="format width"):
        render("{{ '{:>999999999}'.format(1) }}", context)


def test_the_format_filter_width_is_checked(context):
    with pytest.raises(UnsafeTemplate, match="format width"):
        render("{{ '%999999999s' | format('x') }}", context)


def test_a_huge_center_width_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="center width"):
        render("{{ 'x' | center(10**9) }}", context)


def test_a_replace_that_would_grow_too_large_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="replace result length"):
        render("{{ ('a' * 10000000) | replace('a', 'aa') }}", context)


def test_rendered_text_beyond_the_limit_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="rendered text exceeds"):
        render("{% set s = 'x' * 10000 %}{% for i in range(1100) %}{{ s }}{% endfor %}", context)


def test_unbounded_recursion_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="recursion too deep"):
        render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", context)


def test_ordinary_arithmetic_and_small_repetition_still_work(context):
    assert render("{{ 2 ** 10 }} {{ 'ab' * 2 }} {{ '%05d' % 42 }} {{ '{:>4}'.format(7) }}", context) == \
        "1024 abab 00042    7"


def test_an_indent_that_would_grow_too_large_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="indent result length"):
        render("{{ ('a\\n' * 1000000) | indent(100) }}", context)


def test_guarded_filters_still_work_normally(context):
    assert render("{{ 'ab' | center(4) }}|{{ 'a\\nb' | indent(2) }}|{{ 'aXa' | replace('a', 'b') }}", context) == \
        " ab |a\n  b|bXb"


def test_a_huge_batch_size_is_refused(context):
    with pytest.raises(UnsafeTemplate, match="batch size"):
        render("{{ params.labels | batch(10**9, 'x') | list }}", context)


def test_an_unknown_filter_is_a_syntax_error_at_compile_time():
    with pytest.raises(TemplateSyntaxError, match="No filter named 'nosuchfilter'"):
        compile_template("{{ params.x | nosuchfilter }}")
