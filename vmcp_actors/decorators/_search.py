"""BM25 search over tool definitions, with SQLite FTS5 from the standard library.

One in-memory FTS5 table per catalog: a tool's name (split at ``_``, ``-``, ``.`` and
camelCase), its description and its parameter names, weighted in that order of
importance, stemmed by the porter tokenizer. Queries are the words of a description and
keywords OR'ed together, common English words left out; FTS5's ``bm25()`` ranks.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any

# Column weights for bm25(): a word of the name counts most, then the parameter names.
NAME_WEIGHT, DESCRIPTION_WEIGHT, PARAMETERS_WEIGHT = 4.0, 1.0, 2.0
MAX_QUERY_TERMS = 64

_CHUNK = re.compile(r"[^\W_]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
STOPWORDS = frozenset("""
a an and any are as at be by can do does for from give how i in into is it its me my of on or
please some that the their them then there this to tool tools use using want was what when which
who will with would you your need find me
""".split())


# What people say for the five things tools mostly do, so "show the open pull requests"
# also matches list_pull_requests: each word adds its kind's verbs to the query (a fixed
# table, no model; added terms, never replacing the caller's own).
VERB_SYNONYMS: dict[str, tuple[str, ...]] = {}
for _verbs, _said in (
    (("list", "get", "search"), "show which what see view display find look browse overview all any"),
    (("get", "read", "fetch"), "read fetch look details detail inspect check open retrieve"),
    (("create", "add", "new"), "add new make post send upload start file schedule write open insert"),
    (("update", "edit", "set"), "edit change modify rename restart move set patch adjust"),
    (("delete", "remove"), "remove cancel drop erase destroy stop purge clear"),
):
    for _word in _said.split():
        VERB_SYNONYMS[_word] = tuple(dict.fromkeys(VERB_SYNONYMS.get(_word, ()) + _verbs))


def words(text: str) -> list[str]:
    """Lower-case words of ``text``: ``createIssue`` and ``create_issue`` both give create, issue."""
    found: list[str] = []
    for chunk in _CHUNK.findall(text or ""):
        found.extend(_CAMEL.findall(chunk) if chunk.isascii() else [chunk])
    return [word.lower() for word in found]


def parameter_names(tool: dict[str, Any]) -> list[str]:
    schema = tool.get("inputSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return [name for name in properties if isinstance(name, str)] if isinstance(properties, dict) else []


class ToolIndex:
    """The tools of one catalog, searchable. Thread-safe; build once per catalog."""

    def __init__(self, tools: Sequence[dict[str, Any]]):
        self.tools = tuple(tools)
        self._lock = threading.Lock()  # guards _db (one SQLite connection, used by many threads)
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute("CREATE VIRTUAL TABLE tool USING fts5(name, description, parameters, "
                         "tokenize = 'porter unicode61')")
        self._db.executemany(
            "INSERT INTO tool (rowid, name, description, parameters) VALUES (?, ?, ?, ?)",
            ((row, " ".join(words(str(tool.get("name", "")))), str(tool.get("description") or ""),
              " ".join(word for name in parameter_names(tool) for word in words(name)))
             for row, tool in enumerate(self.tools)))

    def search(self, description: str, keywords: str = "", limit: int = 8) -> list[tuple[dict[str, Any], float]]:
        """The best ``limit`` tools for the words of ``description`` and ``keywords``, best
        first, each with its BM25 score (higher is better)."""
        asked = _query_terms(keywords) + _query_terms(description)
        implied = [verb for word in words(description) for verb in VERB_SYNONYMS.get(word, ())]
        terms = list(dict.fromkeys(asked + implied))[:MAX_QUERY_TERMS]
        if not terms or limit <= 0:
            return []
        query = " OR ".join(f'"{term}"' for term in terms)
        with self._lock:
            rows = self._db.execute(
                "SELECT rowid, bm25(tool, ?, ?, ?) AS rank FROM tool WHERE tool MATCH ? ORDER BY rank LIMIT ?",
                (NAME_WEIGHT, DESCRIPTION_WEIGHT, PARAMETERS_WEIGHT, query, limit)).fetchall()
        return [(self.tools[row], float(f"{-rank:.6g}")) for row, rank in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _query_terms(text: str) -> list[str]:
    return [word for word in words(text) if word not in STOPWORDS and len(word) > 1]


def tool_summary(tool: dict[str, Any], score: float) -> dict[str, Any]:
    """What find_tool returns of a tool: enough to call it through call_tool."""
    summary: dict[str, Any] = {"name": tool.get("name"), "description": tool.get("description", ""),
                               "inputSchema": tool.get("inputSchema", {"type": "object"}), "score": score}
    if isinstance(tool.get("annotations"), dict):
        summary["annotations"] = tool["annotations"]
    return summary


def as_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
