"""Every ES|QL query kitune can generate parses with Elastic's own grammar (issue 14 item 4).

Two parsers, neither copied into this repository:

* 9.2+ (FORK and FUSE): the parser generated from Elastic's grammar in
  ``../shared/tools/esql-grammar/`` beside the repository root (``parser/`` holds the generated
  Python; it needs only the ANTLR runtime). Used for the one-query FUSE path.
* 9.1: the PyPI package ``esql-parser==9.1.3`` (a dev dependency; it pins the ANTLR runtime
  4.13.1, which also runs the 9.2+ parser). Used for the per-branch path, which must not need
  anything newer.

The queries cover every branch combination, filters (which change the status list and the DSL,
never the text of user values), the most tags a plan may carry, odd characters in every text
value (they travel as parameters; the test checks they never reach the query text), sizes and
retrieval knobs at their bounds, and every facet.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kitune.config import RetrievalConfig
from kitune.retrieval.es_query import compile_branch_queries, compile_esql, compile_facets
from kitune.schema import Filter, QueryPlan

REPO_ROOT = Path(__file__).resolve().parents[2]
GRAMMAR_DIR = REPO_ROOT.parent / "shared" / "tools" / "esql-grammar"

ODD_TEXTS = (
    "Where was Marie Curie born?",
    'x" | DROP title | WHERE "1"=="1',
    "line one\nline two\ttab",
    "back\\slash ' single ` backtick // not a comment /* nor this */",
    "Zürich — “quotes” ½ 東京 🙂",
    "?lexical ?0 ${x} | FUSE | FORK (",
)
INDEXES = ("kitune-kis", "kis_v2.2026", "2026-kitune")
RETRIEVALS = (
    RetrievalConfig(),
    RetrievalConfig(rrf_k=1, tag_weight=0.0, lexical_weight=2.5, semantic_weight=0.25, branch_size=1),
    RetrievalConfig(rrf_k=1000, branch_size=1000, confidence_floor=90, serve_stale=True),
)
FILTERS = (
    Filter(),
    Filter(statuses=("active", "stale", "expired")),
    Filter(statuses=("stale",), tags_any=("person",), doc_ids=("d1", "d2"), min_confidence=40),
    Filter(statuses=(), subtypes=("disambiguation",), tags_all=("a", "entity:b")),
    Filter().model_copy(update={"subjects": ("Marie Curie",), "predicates": ("born_in",)}),
)
TAG_SETS = ((), ("entity:marie-curie",), tuple(f"entity:e{i}" for i in range(20)))


def _load_92() -> Callable[[str], list[str]]:
    check = GRAMMAR_DIR / "check_esql.py"
    if not check.is_file():
        pytest.fail(
            f"Elastic's ES|QL grammar tool is missing at {GRAMMAR_DIR}: the tests expect shared/ beside "
            "the repository (as in CI)"
        )
    spec = importlib.util.spec_from_file_location("kitune_check_esql_92", check)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.errors  # type: ignore[no-any-return]


def _load_91() -> Callable[[str], list[str]]:
    from antlr4 import CommonTokenStream, InputStream
    from antlr4.error.ErrorListener import ErrorListener
    from esql_parser.EsqlBaseLexer import EsqlBaseLexer
    from esql_parser.EsqlBaseParser import EsqlBaseParser

    class Collect(ErrorListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.errors: list[str] = []

        def syntaxError(self, recognizer, sym, line, col, msg, e):  # type: ignore[no-untyped-def]  # noqa: N802
            self.errors.append(f"{line}:{col} {msg}")

    def errors(text: str) -> list[str]:
        col = Collect()
        lexer = EsqlBaseLexer(InputStream(text))
        lexer.removeErrorListeners()
        lexer.addErrorListener(col)
        parser = EsqlBaseParser(CommonTokenStream(lexer))
        parser.removeErrorListeners()
        parser.addErrorListener(col)
        try:
            parser.singleStatement()
        except Exception as exc:  # the generated code can raise on malformed input
            col.errors.append(f"parser raised {type(exc).__name__}: {exc}")
        return col.errors

    return errors


@pytest.fixture(scope="module")
def parse_92() -> Callable[[str], list[str]]:
    return _load_92()


@pytest.fixture(scope="module")
def parse_91() -> Callable[[str], list[str]]:
    return _load_91()


def _plans() -> list[QueryPlan]:
    plans = []
    for tags, lexical, semantic in itertools.product(TAG_SETS, ("", *ODD_TEXTS[:3]), ("", *ODD_TEXTS[3:])):
        if not (tags or lexical or semantic):
            continue
        plans.append(QueryPlan(entity_tags=tags, lexical=lexical, semantic=semantic, size=7))
    return plans


PLANS = _plans()


def _variants() -> list[tuple[QueryPlan, str, RetrievalConfig]]:
    out = []
    for n, (plan, flt) in enumerate(itertools.product(PLANS, FILTERS)):
        size = (1, 7, 1000)[n % 3]
        out.append(
            (plan.model_copy(update={"filters": flt, "size": size}), INDEXES[n % 3], RETRIEVALS[(n // 3) % 3])
        )
    return out


VARIANTS = _variants()


def _assert_no_user_text(query: str, plan: QueryPlan) -> None:
    for value in (plan.lexical, plan.semantic, *plan.entity_tags):
        if value.strip():
            assert value not in query, f"user text {value!r} was written into the query text"


def test_the_matrix_covers_every_branch_combination() -> None:
    combos = {
        (bool(p.entity_tags), bool(p.lexical.strip()), bool(p.semantic.strip())) for p, _, _ in VARIANTS
    }
    assert len(combos) == 7 and len(VARIANTS) == 47 * len(FILTERS)


def test_fuse_path_queries_parse_with_the_92_grammar(parse_92: Callable[[str], list[str]]) -> None:
    texts = set()
    for plan, index, retrieval in VARIANTS:
        q = compile_esql(plan, index, retrieval)
        _assert_no_user_text(q.query, plan)
        texts.add(q.query)  # user values are parameters, so many plans share one text: parse each once
    bad = {t: errs for t in sorted(texts) if (errs := parse_92(t))}
    assert bad == {}
    assert any("| FUSE RRF WITH" in t for t in texts) and any("FORK" not in t for t in texts)


def test_per_branch_path_queries_parse_with_the_91_and_92_grammars(
    parse_91: Callable[[str], list[str]], parse_92: Callable[[str], list[str]]
) -> None:
    texts = set()
    seen = 0
    for plan, index, retrieval in VARIANTS:
        for q in compile_branch_queries(plan, index, retrieval):
            _assert_no_user_text(q.query, plan)
            assert "FORK" not in q.query and "FUSE" not in q.query
            seen += 1
            texts.add(q.query)
    bad = {
        (name, t): errs
        for t in sorted(texts)
        for name, parse in (("9.1.3", parse_91), ("9.2+", parse_92))
        if (errs := parse(t))
    }
    assert bad == {}
    assert seen > len(VARIANTS) and len(texts) > 20


def test_facet_queries_parse_with_both_grammars(
    parse_91: Callable[[str], list[str]], parse_92: Callable[[str], list[str]]
) -> None:
    for by, limit, index in itertools.product(
        ("tags", "doc", "status", "subtype"), (1, 100, 10_000), INDEXES
    ):
        q = compile_facets(index, Filter(doc_ids=("d1",)), by=by, limit=limit)
        assert parse_91(q.query) == [] and parse_92(q.query) == [], q.query


def test_the_parsers_reject_what_each_version_lacks(
    parse_91: Callable[[str], list[str]], parse_92: Callable[[str], list[str]]
) -> None:
    """The checks have teeth: 9.1 has no FUSE (hence the per-branch path), and broken text fails both."""
    fuse = compile_esql(QueryPlan(lexical="a", semantic="b"), "kitune-kis", RetrievalConfig()).query
    assert parse_92(fuse) == []
    assert parse_91(fuse) != []
    broken = fuse.replace("| SORT _score DESC\n| KEEP", "| SORT _score DESC |\n| KEEP")
    assert parse_92(broken) != [] and parse_91(broken) != []
    assert "esql_parser" in sys.modules


def test_an_index_named_metadata_is_quoted_and_parses(
    parse_91: Callable[[str], list[str]], parse_92: Callable[[str], list[str]]
) -> None:
    """Issue 25: ``FROM metadata METADATA …`` failed to parse; the name is now written quoted."""
    import re

    from kitune.retrieval.es_query import FROM_KEYWORDS, esql_source

    # the keywords kitune quotes are exactly the FROM-mode keywords of Elastic's lexer
    from_g4 = (GRAMMAR_DIR / "grammar" / "lexer" / "From.g4").read_text(encoding="utf-8")
    mode = from_g4.split("mode FROM_MODE;", 1)[1]
    assert {w for w in re.findall(r"^[A-Z_]+\s*:\s*'([a-z_]+)'\s*;", mode, re.MULTILINE)} == FROM_KEYWORDS
    unquoted = "FROM metadata METADATA _id, _index, _score\n| LIMIT 1"
    assert parse_91(unquoted) != [] and parse_92(unquoted) != []  # the bug, in both grammars
    assert (esql_source("metadata"), esql_source("kitune-kis"), esql_source("metadata-v2")) == (
        '"metadata"',
        "kitune-kis",
        "metadata-v2",
    )
    plan = QueryPlan(entity_tags=("entity:acme",), lexical="Acme", semantic="Acme founder", size=5)
    fused = compile_esql(plan, "metadata", RetrievalConfig()).query
    assert fused.startswith('FROM "metadata" METADATA _id, _index, _score\n') and parse_92(fused) == []
    for q in compile_branch_queries(plan, "metadata", RetrievalConfig()):
        assert q.query.startswith('FROM "metadata" METADATA') and parse_91(q.query) == parse_92(q.query) == []
    facets = compile_facets("metadata", None, by="doc", limit=10).query
    assert facets.startswith('FROM "metadata"\n') and parse_91(facets) == parse_92(facets) == []
