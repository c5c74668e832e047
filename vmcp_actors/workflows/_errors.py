"""Errors of composite-tool templates.

They live here rather than in ``vmcp_actors/exceptions.py`` only because this package is
being built apart from the rest; they derive from :class:`VmcpError` like every project
error and can move there unchanged.
"""

from __future__ import annotations

from vmcp_actors.exceptions import VmcpError


class TemplateError(VmcpError):
    """A template could not be compiled or rendered.

    ``message`` says what went wrong, ``source`` is the template as written, and
    ``location`` (set by :func:`render_value`) says where in an ``arguments`` structure it
    sits, e.g. ``filters[0].name``. ``str(error)`` is ``location: message``.
    """

    def __init__(self, message: str, *, source: str | None = None, location: str = ""):
        self.message = message
        self.source = source
        self.location = location
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class TemplateSyntaxError(TemplateError):
    """The template is not valid Jinja (``line`` is 1-based, in the source as written)."""

    def __init__(self, message: str, *, line: int, source: str | None = None, location: str = ""):
        self.line = line
        super().__init__(f"template syntax error at line {line}: {message}", source=source, location=location)


class TemplateRenderError(TemplateError):
    """Rendering failed: an undefined name, a failing filter, a condition that is not a boolean."""


class UnsafeTemplate(TemplateRenderError):
    """The sandbox refused something: Python internals, file access, or a resource limit.

    Raised at compile time where the refusal is visible in the template text (dunder
    attributes, include/import/extends), else at render time.
    """
