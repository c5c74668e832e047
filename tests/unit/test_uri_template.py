import pytest

from vmcp_actors.core._uri_template import (
    InvalidUriTemplate,
    compile_uri_template,
)


def uri_matches_template(uri: str, template: str) -> bool:
    """How the catalog routes a URI: a template that does not compile matches nothing."""
    try:
        return compile_uri_template(template).match(uri) is not None
    except InvalidUriTemplate:
        return False


@pytest.mark.parametrize(
    "template, uri, matches",
    [
        ("test://{name}/items/{item}", "test://a/items/42", True),
        ("test://{name}/items/{item}", "test://a/items/42/more", False),
        ("test://{name}/items/{item}", "test://a/other/42", False),
        ("file:///{+path}", "file:///a/b/c.txt", True),
        ("file:///{path}", "file:///a/b", False),
        ("api://x{/segment}", "api://x/a", True),
        ("api://x{/segments*}", "api://x/a/b", True),
        ("api://x{.ext}", "api://x.json", True),
        ("search://q{?term,limit}", "search://q?term=a&limit=5", True),
        ("search://q{?term}{&limit}", "search://q?term=a&limit=5", True),
        ("doc://page{#section}", "doc://page#intro", True),
        ("literal://only", "literal://only", True),
        ("literal://only", "literal://other", False),
    ],
)
def test_uri_template_matching(template, uri, matches):
    assert uri_matches_template(uri, template) is matches


@pytest.mark.parametrize("template", ["a://{", "a://{}", "a://{=x}", "a://{a}{b}"])
def test_invalid_templates_are_rejected(template):
    with pytest.raises(InvalidUriTemplate):
        compile_uri_template(template)
    assert uri_matches_template("a://x", template) is False


def test_matching_is_the_mcp_sdks_own_so_routing_agrees_with_sdk_backends():
    from mcp.shared.uri_template import UriTemplate

    for template, uri in [("test://{name}/items/{item}", "test://a/items/42"), ("file:///{+path}", "file:///x/y")]:
        assert uri_matches_template(uri, template) == (UriTemplate.parse(template).match(uri) is not None)


def test_regex_metacharacters_in_literals_are_literal():
    assert uri_matches_template("a://x.y", "a://x.y")
    assert not uri_matches_template("a://xzy", "a://x.y")
