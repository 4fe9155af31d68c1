"""`kitune mcp` over stdio, driven by the MCP SDK's own client (issue 16 done-when)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client

from kitune.config import load_config
from kitune.ki import KI
from kitune.retrieval import create_corpus_store, create_store
from kitune.schema import Document

SRC = Path(__file__).resolve().parents[2] / "src"


def _ki(
    docid: str, subject: str, obj: str, title: str, *, tags: list[str], subtype: str = "dataset_fact"
) -> KI:
    return KI.from_fact(
        docid=docid,
        title=title,
        description=f"{title} The registry lists it.",
        subject=subject,
        predicate="headquartered_in",
        obj=obj,
        evidence=[title],
        confidence=80,
        tags=tags,
        corpus="firms",
        subtype=subtype,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mcp")
    path = root / "kitune.yaml"
    path.write_text(
        f"workdir: {root / 'work'}\n"
        "embedder: {type: hash, dim: 64}\n"
        f"store: {{type: lancedb, path: {root / 'lance'}}}\n"
        "retrieval: {max_size: 20}\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    # kitune mcp serves the production extractor's KI table, like serve/context/extract
    from kitune.service.serving.prompts import production_setting

    store = create_store(production_setting(cfg).store_cfg)
    result = store.upsert(
        [
            _ki("d1", "Acme Corp", "Springfield", "Acme Corp is headquartered in Springfield.", tags=["org"]),
            _ki("d2", "Globex", "Shelbyville", "Globex is headquartered in Shelbyville.", tags=["org"]),
            _ki("d3", "Initech", "Austin", "Initech is headquartered in Austin.", tags=["org", "software"]),
            _ki(
                "src",
                "Firms registry",
                "companies",
                "The firms corpus is a registry of companies.",
                tags=["source-description"],
                subtype="source_description",
            ),
        ]
    )
    assert result.ok
    store.close()
    corpus = create_corpus_store(cfg)
    corpus.add_documents(
        [
            Document(
                docid="d1",
                title="Acme Corp",
                text="Acme Corp is a maker of anvils headquartered in Springfield.",
            ),
            Document(
                docid="d2", title="Globex", text="Globex Corporation has its head office in Shelbyville."
            ),
        ]
    )
    return path


def _params(config_path: Path) -> StdioServerParameters:
    env = {
        "PYTHONPATH": str(SRC),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "KITUNE_CONFIG": str(config_path),
    }
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kitune", "mcp", "--no-rewrite", "--config", str(config_path)],
        env=env,
        cwd=str(config_path.parent),
    )


def _payload(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        data = result.structured_content
        return data.get("result", data) if set(data) == {"result"} else data
    return json.loads(result.content[0].text)


def _session_run(config_path: Path, body: Any) -> Any:
    async def main() -> Any:
        async with stdio_client(_params(config_path)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await body(session)

    return anyio.run(main)


def test_tools_listed_with_schemas(config_path: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return (await session.list_tools()).tools

    tools = {t.name: t for t in _session_run(config_path, body)}
    assert set(tools) == {"get_context", "search_documents", "get_document"}
    schema = tools["get_context"].input_schema
    assert schema["required"] == ["query"]
    props = schema["properties"]
    assert props["query"]["maxLength"] == 2000
    size = props["size"]["anyOf"][0]
    assert (size["minimum"], size["maximum"]) == (1, 20)  # retrieval.max_size from the config
    assert "filters" in props
    assert tools["get_document"].input_schema["required"] == ["docid"]


def test_get_context_returns_kis_with_aggregations(config_path: Path) -> None:
    async def body(session: ClientSession) -> Any:
        plain = await session.call_tool("get_context", {"query": "Where is Globex headquartered?", "size": 2})
        filtered = await session.call_tool(
            "get_context",
            {"query": "Which company is headquartered where?", "filters": {"tags_all": ["software"]}},
        )
        doc = await session.call_tool("get_document", {"docid": "d2"})
        hits = await session.call_tool("search_documents", {"query": "anvils Springfield", "k": 1})
        resource = await session.read_resource("kitune://source-description")
        return plain, filtered, doc, hits, resource

    plain, filtered, doc, hits, resource = _session_run(config_path, body)
    data = _payload(plain)
    assert len(data["kis"]) == 2
    top = data["kis"][0]
    assert top["title"] == "Globex is headquartered in Shelbyville."
    assert top["evidence_doc_ids"] == ["d2"]
    assert top["references"] == ["index://firms"]
    assert {"org", "entity:globex", "doc:d2"} <= set(top["tags"])
    assert top["subtype"] == "dataset_fact" and top["confidence"] == 80
    aggs = data["aggregations"]
    assert aggs["by_tag"]["org"] == 2 and sum(aggs["by_doc"].values()) == 2 and aggs["by_doc"]["d2"] == 1
    assert aggs["by_entity"]["globex"] == 1
    only = _payload(filtered)
    assert [k["evidence_doc_ids"] for k in only["kis"]] == [["d3"]]
    assert only["aggregations"]["by_tag"] == {"org": 1, "software": 1}
    d = _payload(doc)
    assert d["docid"] == "d2" and d["text"].startswith("Globex Corporation") and d["truncated"] is False
    assert [h["docid"] for h in _payload(hits)["hits"]] == ["d1"]
    text = resource.contents[0].text
    assert "The firms corpus is a registry of companies." in text


def test_bad_arguments_are_clear_tool_errors(config_path: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return (
            await session.call_tool("get_context", {"query": "Globex", "size": 500}),
            await session.call_tool(
                "get_context", {"query": "Globex", "filters": {"tags_any": ["Bad Tag!"]}}
            ),
            await session.call_tool("get_document", {"docid": "nope"}),
            await session.call_tool("get_context", {"query": "   "}),
        )

    too_big, bad_tag, missing, blank = _session_run(config_path, body)
    for r in (too_big, bad_tag, missing, blank):
        assert r.is_error
    assert "size" in too_big.content[0].text and "20" in too_big.content[0].text
    assert "tag" in bad_tag.content[0].text.lower()
    assert "nope" in missing.content[0].text and "evidence_doc_ids" in missing.content[0].text
    assert "blank" in blank.content[0].text
    for r in (too_big, bad_tag, missing, blank):
        assert "Traceback" not in r.content[0].text


def test_filter_errors_name_the_field(config_path: Path) -> None:
    async def body(session: ClientSession) -> Any:
        return await session.call_tool(
            "get_context", {"query": "Globex", "filters": {"tags_any": ["Bad Tag!"]}}
        )

    text = _session_run(config_path, body).content[0].text
    assert "filters.tags_any: malformed tags ['Bad Tag!']" in text
    assert "lowercase a-z0-9-" in text and "pydantic" not in text


# -- issue 25: the server owns stdout, refuses unknown arguments, follows a promotion -------------

NOISE = "noise printed by a library at import"

# The server as `python -u -m kitune mcp …`, with an import hook that prints to stdout when the
# MCP SDK is first imported (a library that prints at import; -u: nothing is held in a buffer).
NOISY_MAIN = f"""
import runpy, sys

class Noisy:
    def find_spec(self, name, path=None, target=None):
        if name == "mcp":
            sys.meta_path.remove(self)
            print({NOISE!r})
        return None

sys.meta_path.insert(0, Noisy())
sys.argv = ["kitune", *sys.argv[1:]]
runpy.run_module("kitune", run_name="__main__", alter_sys=True)
"""


def test_output_printed_at_import_goes_to_stderr_not_the_wire(
    config_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    params = _params(config_path)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-u", "-c", NOISY_MAIN, *params.args[2:]],  # the same `kitune mcp …` arguments
        env={**(params.env or {}), "PYTHONUNBUFFERED": "1"},
        cwd=params.cwd,
    )
    errlog = tmp_path / "server.stderr"

    async def main() -> Any:
        with errlog.open("w", encoding="utf-8") as err:
            async with stdio_client(params, errlog=err) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await session.call_tool("get_context", {"query": "Where is Globex?", "size": 1})

    with caplog.at_level(logging.ERROR, logger="mcp.client.stdio"):
        result = anyio.run(main)
    assert _payload(result)["kis"][0]["evidence_doc_ids"] == ["d2"]
    # every line the client read was a JSON-RPC message ("Invalid JSON" is logged otherwise)
    assert [r.getMessage() for r in caplog.records if r.name == "mcp.client.stdio"] == []
    assert NOISE in errlog.read_text(encoding="utf-8")  # the print went to stderr


def test_unknown_arguments_are_refused_by_name(config_path: Path) -> None:
    async def body(session: ClientSession) -> Any:
        tools = {t.name: t.input_schema for t in (await session.list_tools()).tools}
        typo = await session.call_tool("get_context", {"query": "Where is Globex?", "sise": 1})
        extra = await session.call_tool("get_document", {"docid": "d2", "max_chars": 10})
        nested = await session.call_tool("get_context", {"query": "Globex", "filters": {"tag": ["org"]}})
        return tools, typo, extra, nested

    tools, typo, extra, nested = _session_run(config_path, body)
    assert {name: schema["additionalProperties"] for name, schema in tools.items()} == {
        "get_context": False,
        "search_documents": False,
        "get_document": False,
    }
    assert typo.is_error and extra.is_error and nested.is_error
    assert typo.content[0].text == (
        "Error executing tool get_context: unknown argument(s) ['sise']: "
        "get_context takes query, size, filters"
    )
    assert extra.content[0].text == (
        "Error executing tool get_document: unknown argument(s) ['max_chars']: get_document takes docid"
    )
    assert nested.content[0].text.startswith(  # the filters model names the unknown field itself
        "Error executing tool get_context: 1 validation error for get_contextArguments\nfilters.tag\n"
        "  Extra inputs are not permitted"
    )


def test_a_running_mcp_serves_a_promotion_without_restart(tmp_path: Path) -> None:
    from kitune.programs.instructions import instruction_version, load_instruction
    from kitune.service.serving.prompts import production_setting, versioned_store_cfg
    from kitune.tracking.prompts import PromptRegistry, prompt_name, register_packaged

    path = tmp_path / "kitune.yaml"
    path.write_text(
        f"workdir: {tmp_path / 'work'}\nembedder: {{type: hash, dim: 64}}\n"
        f"store: {{type: lancedb, path: {tmp_path / 'lance'}}}\n",
        encoding="utf-8",
    )
    cfg = load_config(path)
    new_text = load_instruction("extractor").text + "\n\nDomain focus (firms): name the city."
    reg = PromptRegistry(cfg.mlflow_uri)
    register_packaged(reg, cfg.corpus_name, ("extractor",))  # production: the packaged extractor (v1)
    name = prompt_name(cfg.corpus_name, "extractor")
    v2 = reg.register(name, new_text, commit_message="accepted by the loop").version
    # the v2 extractor's KI table holds the fact; v1's is empty
    promoted = create_store(versioned_store_cfg(cfg, instruction_version("extractor", new_text)))
    assert promoted.upsert(
        [_ki("d2", "Globex", "Shelbyville", "Globex is headquartered in Shelbyville.", tags=["org"])]
    ).ok
    promoted.close()
    params = _params(path)
    params = StdioServerParameters(
        command=params.command, args=[*params.args, "--refresh-s", "1"], env=params.env, cwd=str(tmp_path)
    )
    ask = {"query": "Where is Globex headquartered?"}

    async def main() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                before = await session.call_tool("get_context", ask)
                reg.promote(name, v2)  # `kitune prompts promote`, while the server runs
                await anyio.sleep(1.5)
                after = await session.call_tool("get_context", ask)
                return before, after

    before, after = anyio.run(main)
    assert production_setting(cfg).versions["extractor"] == f"{name} v2 (production)"
    assert _payload(before)["kis"] == []
    assert [k["title"] for k in _payload(after)["kis"]] == ["Globex is headquartered in Shelbyville."]
