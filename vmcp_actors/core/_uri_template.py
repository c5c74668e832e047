"""Matching URIs against RFC 6570 URI templates, to route resources/read to the backend
whose template fits.

RFC 6570 only defines expansion; matching is its inverse. The official MCP SDK's
``UriTemplate`` is the matcher MCP servers built with it use to route their own reads, so
the gateway uses the same one: a URI goes to the backend that would itself accept it.
"""

from __future__ import annotations

from functools import lru_cache

from mcp.shared.uri_template import InvalidUriTemplate as _SdkInvalidUriTemplate
from mcp.shared.uri_template import UriTemplate


class InvalidUriTemplate(ValueError):
    pass


@lru_cache(maxsize=1024)
def compile_uri_template(template: str) -> UriTemplate:
    try:
        return UriTemplate.parse(template)
    except _SdkInvalidUriTemplate as error:
        raise InvalidUriTemplate(str(error)) from None
