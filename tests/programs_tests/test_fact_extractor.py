"""The extractor program with deterministic stand-in LMs: parsing, retry, chunking, versions."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import dspy
import pytest
from dspy.utils import DummyLM

from kitune.config import load_config
from kitune.errors import ConfigError
from kitune.ki import ki_id
from kitune.programs.fact_extractor import FactExtractor, split_text
from kitune.programs.instructions import instruction_version, load_instruction
from kitune.schema import Document

NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
TEXT = "Acme Corp was founded in 1999 by Jane Roe. Acme Corp is headquartered in Springfield."
DOC = Document(docid="d1", text=TEXT, title="Acme Corp", url="https://example.org/acme")


def fact(subject: str, predicate: str, obj: str, evidence: str, **extra: object) -> dict[str, object]:
    return {
        "title": f"{subject} {predicate.replace('_', ' ')} {obj}",
        "description": f"{subject} {predicate.replace('_', ' ')} {obj}.",
        "subject": subject,
        "predicate": predicate,
        "object": obj,
        "evidence_span": evidence,
        "confidence": 80,
        "tags": ["org"],
        **extra,
    }


FOUNDED = fact("Acme Corp", "founded_in", "1999", "Acme Corp was founded in 1999")
HQ = fact("Acme Corp", "headquartered_in", "Springfield", "Acme Corp is headquartered in Springfield")
INVENTED = fact("Acme Corp", "founded_by", "John Doe", "Acme Corp was founded by John Doe")


def test_named_predictor_carries_the_packaged_instruction() -> None:
    extractor = FactExtractor()
    names = [name for name, _ in extractor.named_predictors()]
    assert names == ["extract"]
    ins = load_instruction("extractor")
    assert extractor.extract.signature.instructions == ins.text
    assert extractor.prompt_version == ins.version == instruction_version("extractor", ins.text)
    assert ins.version.startswith("extractor@") and len(ins.version) == len("extractor@") + 8


def test_rewritten_instruction_changes_the_prompt_version() -> None:
    extractor = FactExtractor("List the facts as JSON.")
    assert extractor.prompt_version == instruction_version("extractor", "List the facts as JSON.")
    assert extractor.prompt_version != load_instruction("extractor").version


def test_packaged_instruction_is_domain_neutral() -> None:
    text = load_instruction("extractor").text.lower()
    for word in ("located_in", "founded_by", "position_held", "born_in", "member_of", "an empty list"):
        assert word in text
    for leak in ("musique", "hotpot", "browsecomp", "question:"):
        assert leak not in text


def test_extracts_verified_kis_and_counts_drops() -> None:
    lm = DummyLM({"founded in 1999": {"facts": json.dumps({"facts": [FOUNDED, HQ, INVENTED]})}})
    with dspy.context(lm=lm):
        result = FactExtractor(corpus="fixture").extract_document(DOC, now=NOW)
    assert result.status == "ok"
    assert [k.id for k in result.kis] == [
        ki_id("d1", "Acme Corp", "founded_in", "1999"),
        ki_id("d1", "Acme Corp", "headquartered_in", "Springfield"),
    ]
    assert [k.payload.evidence for k in result.kis] == [
        ["Acme Corp was founded in 1999"],
        ["Acme Corp is headquartered in Springfield"],
    ]
    assert result.kis[0].references == ["index://fixture"]
    assert result.kis[0].prompt_version == load_instruction("extractor").version
    assert result.drops == {"evidence_not_found": 1}
    assert result.counters["lm_calls"] == 1
    # the prompt carried the document fields
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert "d1" in prompt and "https://example.org/acme" in prompt


def test_malformed_reply_is_retried_once_bypassing_the_cache_then_succeeds() -> None:
    lm = DummyLM([{"facts": "Let me analyze the document step by step"}, {"facts": json.dumps([FOUNDED])}])
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(DOC, now=NOW)
    assert result.status == "ok"
    assert len(result.kis) == 1
    assert result.counters["retries"] == 1 and result.counters["parse_failures"] == 1
    assert lm.history[0]["kwargs"].get("rollout_id") is None
    assert lm.history[1]["kwargs"]["cache"] is False
    assert lm.history[1]["kwargs"]["rollout_id"] == 1
    assert lm.history[1]["kwargs"]["temperature"] > 0


def test_still_malformed_after_retry_is_failed_with_raw_kept() -> None:
    lm = DummyLM({"founded in 1999": {"facts": "1. Identify the organisations"}})
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(DOC, now=NOW)
    assert result.status == "failed"
    assert result.kis == ()
    assert "no JSON object found" in result.error
    assert "1. Identify the organisations" in result.raw  # the whole reply, as the model wrote it
    assert result.counters == {"lm_calls": 2, "retries": 1, "parse_failures": 2}


def test_all_records_rejected_counts_as_malformed() -> None:
    bad = json.dumps([{"title": "T", "subject": "S"}])
    lm = DummyLM({"founded in 1999": {"facts": bad}})
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(DOC, now=NOW)
    assert result.status == "failed"
    assert "missing required field" in result.error


def test_empty_list_is_ok_with_zero_kis() -> None:
    lm = DummyLM({"founded in 1999": {"facts": "[]"}})
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(DOC)
    assert (result.status, result.kis, result.counters["lm_calls"]) == ("ok", (), 1)


def test_split_text_cuts_at_boundaries_and_loses_nothing() -> None:
    para1 = "First paragraph sentence one. Sentence two is here."
    para2 = "Second paragraph starts. It continues a while longer."
    text = para1 + "\n\n" + para2
    chunks = split_text(text, 70)
    assert [c for _, c in chunks] == [para1 + "\n\n", para2]
    assert "".join(c for _, c in chunks) == text
    for offset, chunk in chunks:
        assert text[offset : offset + len(chunk)] == chunk
    long_words = " ".join(f"w{i}" for i in range(100))
    pieces = split_text(long_words, 50)
    assert all(len(c) <= 50 for _, c in pieces)
    assert "".join(c for _, c in pieces) == long_words
    assert split_text("x" * 120, 50) == [(0, "x" * 50), (50, "x" * 50), (100, "x" * 20)]
    assert split_text("short", 50) == [(0, "short")]


def test_long_document_is_chunked_and_evidence_checked_per_chunk() -> None:
    filler = "Filler words about nothing in particular. " * 20
    text = TEXT + "\n\n" + filler + "\n\nThe Springfield plant employs 412 workers."
    doc = Document(docid="d9", text=text)
    late = fact("Springfield plant", "employee_count", "412", "The Springfield plant employs 412 workers")
    lm = DummyLM(
        {
            "Acme Corp was founded": {"facts": json.dumps([FOUNDED])},
            "employs 412": {"facts": json.dumps([late, FOUNDED])},
            "Filler words": {"facts": "[]"},
        }
    )
    with dspy.context(lm=lm):
        result = FactExtractor(chunk_chars=500).extract_document(doc, now=NOW)
    assert result.status == "ok"
    assert result.chunks == len(split_text(text, 500)) >= 3
    assert [k.payload.properties.object for k in result.kis] == ["1999", "412"]
    # FOUNDED repeated by the last chunk is the same KI id: dropped as a duplicate
    assert result.drops == {"duplicate": 1}
    assert result.counters["lm_calls"] == result.chunks


def test_evidence_outside_its_chunk_is_dropped() -> None:
    filler = "Filler words about nothing in particular. " * 20
    text = TEXT + "\n\n" + filler
    lm = DummyLM({"Acme Corp was founded": {"facts": "[]"}, "Filler words": {"facts": json.dumps([HQ])}})
    with dspy.context(lm=lm):
        result = FactExtractor(chunk_chars=500).extract_document(Document(docid="d8", text=text), now=NOW)
    assert result.chunks == 2
    assert result.kis == () and result.drops == {"evidence_not_found": 1}


def test_max_facts_caps_the_document() -> None:
    lm = DummyLM({"founded in 1999": {"facts": json.dumps([FOUNDED, HQ])}})
    with dspy.context(lm=lm):
        result = FactExtractor(max_facts=1).extract_document(DOC, now=NOW)
    assert len(result.kis) == 1 and result.drops == {"over_cap": 1}


def test_from_config_uses_extraction_settings() -> None:
    cfg = load_config(
        overrides={"extraction.max_facts_per_doc": 3, "extraction.chunk_chars": 800, "corpus_name": "dev"}
    )
    ex = FactExtractor.from_config(cfg)
    assert (ex.max_facts, ex.chunk_chars, ex.corpus) == (3, 800, "dev")


def test_forward_returns_prediction_with_kis() -> None:
    lm = DummyLM({"founded in 1999": {"facts": json.dumps([FOUNDED])}})
    with dspy.context(lm=lm):
        pred = FactExtractor()(docid="d1", text=TEXT)
    assert pred.status == "ok"
    assert [k.payload.properties.predicate for k in pred.kis] == ["founded_in"]


def test_split_text_rejects_bad_size() -> None:
    with pytest.raises(ValueError, match="chunk_chars"):
        split_text("abc", 0)


def test_blank_document_makes_no_call() -> None:
    lm = DummyLM([])
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(Document(docid="e", text="  \n "))
    assert (result.status, result.kis, result.chunks, len(lm.history)) == ("ok", (), 0, 0)


# --- finish_reason read on every call; a cut reply retried with more room (issue 13 item 4) ---

from kitune.lm import KituneLM, reset_format_memory  # noqa: E402
from kitune.testing.lm import stub_server_lm  # noqa: E402
from kitune.testing.openai_stub import Reply, StubServer  # noqa: E402


def _stub_lm(stub: StubServer, max_tokens: int = 512) -> KituneLM:
    reset_format_memory()
    return stub_server_lm(stub.base_url, max_tokens=max_tokens)


CUT = json.dumps([FOUNDED, HQ])[: len(json.dumps([FOUNDED])) + 40]  # first record whole, second cut


def test_length_cut_reply_is_retried_once_with_double_max_tokens() -> None:
    with StubServer() as stub:
        stub.push(Reply.ok(CUT, finish_reason="length"), Reply.ok(json.dumps([FOUNDED, HQ])))
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor().extract_document(DOC, now=NOW)
        sent = [r.body["max_tokens"] for r in stub.chat_requests]
    assert sent == [512, 1024]  # never the same size twice
    assert result.status == "ok"
    assert [k.payload.properties.object for k in result.kis] == ["1999", "Springfield"]
    assert result.counters["truncated_replies"] == 1
    assert result.counters["truncation_retries"] == 1
    assert result.counters["lm_calls"] == 2
    assert "kept_from_truncated" not in result.counters


def test_reply_cut_twice_is_failed_with_its_records_counted_not_kept_by_default() -> None:
    # issue 40: records rescued from a cut-off retry are kept only on request
    with StubServer() as stub:
        stub.push(Reply.ok(CUT, finish_reason="length"), Reply.ok(CUT, finish_reason="length"))
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor().extract_document(DOC, now=NOW)
        sent = [r.body["max_tokens"] for r in stub.chat_requests]
    assert sent == [512, 1024]
    assert (result.status, result.kis) == ("failed", ())
    assert result.counters["truncated_replies"] == 2
    assert result.counters["truncated_records_dropped"] == 1
    assert "kept_from_truncated" not in result.counters
    failure = result.parse_failure
    assert failure is not None
    assert (failure.status, failure.reason, failure.finish_reason, failure.records_dropped) == (
        "cut_off",
        "length",
        "length",
        1,
    )
    assert failure.adapter == "KituneJSONAdapter" and failure.raw == CUT
    assert "keep_truncated_records" in result.error


def test_reply_cut_twice_keeps_its_complete_records_only_when_asked() -> None:
    with StubServer() as stub:
        stub.push(Reply.ok(CUT, finish_reason="length"), Reply.ok(CUT, finish_reason="length"))
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor(keep_truncated=True).extract_document(DOC, now=NOW)
    assert result.status == "partial"  # not ok: facts may be missing
    assert [k.payload.properties.object for k in result.kis] == ["1999"]
    assert result.counters["truncated_replies"] == 2
    assert result.counters["kept_from_truncated"] == 1
    assert "truncated_records_dropped" not in result.counters and result.parse_failure is None


def test_an_unparseable_reply_is_a_structured_record() -> None:
    prose = "Let me analyze the provided document step by step:\n1. Identify the organisations"
    with StubServer() as stub:
        stub.push(Reply.ok(prose), Reply.ok(prose))
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor().extract_document(DOC, now=NOW)
    assert (result.status, result.kis, result.counters["parse_failures"]) == ("failed", (), 2)
    failure = result.parse_failure
    assert failure is not None
    assert failure.to_dict() == {
        "status": "unparseable",
        "reason": "no_json",
        "adapter": "KituneJSONAdapter",
        "exception": "ReplyParseError",
        "detail": result.error,
        "raw": prose,
        "finish_reason": "stop",
        "records_dropped": 0,
    }
    assert result.error.startswith("no JSON object found")


def test_length_cut_complete_json_still_counts_as_cut() -> None:
    # The JSON happens to close, but the provider says the reply hit max_tokens: retried.
    with StubServer() as stub:
        stub.push(
            Reply.ok(json.dumps([FOUNDED]), finish_reason="length"), Reply.ok(json.dumps([FOUNDED, HQ]))
        )
        with dspy.context(lm=_stub_lm(stub, max_tokens=300)):
            result = FactExtractor().extract_document(DOC, now=NOW)
        sent = [r.body["max_tokens"] for r in stub.chat_requests]
    assert sent == [300, 600]
    assert result.status == "ok" and len(result.kis) == 2


def test_at_the_token_cap_a_cut_chunk_is_split_in_two_halves() -> None:
    with StubServer() as stub:
        stub.push(
            Reply.ok(CUT, finish_reason="length"),
            Reply.ok(json.dumps([FOUNDED])),
            Reply.ok(json.dumps([HQ])),
        )
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor(max_retry_tokens=512).extract_document(DOC, now=NOW)
        requests = stub.chat_requests
    assert [r.body["max_tokens"] for r in requests] == [512, 512, 512]
    halves = [r.body["messages"][-1]["content"] for r in requests[1:]]
    assert "Acme Corp was founded in 1999 by Jane Roe." in halves[0]
    assert "headquartered in Springfield" not in halves[0]
    assert "Acme Corp is headquartered in Springfield." in halves[1]
    assert result.status == "ok"
    assert [k.payload.properties.object for k in result.kis] == ["1999", "Springfield"]
    assert result.counters["truncation_splits"] == 1


def test_at_the_token_cap_a_cut_reply_with_complete_facts_is_kept_without_more_calls() -> None:
    # extraction.split_cut_chunks off (a slow CPU model): at the cap the cut reply's complete facts
    # are kept (status partial) instead of two more calls on the chunk's halves
    cut_after_one = json.dumps([FOUNDED, HQ])[:-40]
    with StubServer() as stub:
        stub.push(Reply.ok(cut_after_one, finish_reason="length"))
        with dspy.context(lm=_stub_lm(stub, max_tokens=512)):
            result = FactExtractor(
                max_retry_tokens=512, split_cut_chunks=False, keep_truncated=True
            ).extract_document(DOC, now=NOW)
        assert len(stub.chat_requests) == 1
    assert result.status == "partial"
    assert [k.payload.properties.object for k in result.kis] == ["1999"]
    assert result.counters["kept_from_truncated"] == 1 and "truncation_splits" not in result.counters


def test_extraction_retry_settings_reach_the_extractor() -> None:
    cfg = load_config(overrides={"extraction": {"max_retry_tokens": 600, "split_cut_chunks": False}})
    assert FactExtractor.from_config(cfg).max_retry_tokens == 600
    assert FactExtractor.from_config(cfg).split_cut_chunks is False
    default = FactExtractor.from_config(load_config())
    assert default.max_retry_tokens == 8192 and default.split_cut_chunks is True
    assert default.keep_truncated is False
    kept = load_config(overrides={"extraction": {"keep_truncated_records": True}})
    assert FactExtractor.from_config(kept).keep_truncated is True


def test_packaged_instruction_follows_the_published_rules() -> None:
    text = load_instruction("extractor").text
    assert "0-3 facts for a short or generic document" in text
    assert "8-15 for a long, fact-dense one" in text
    assert "avoid affiliated_with" in text
    assert "even a single sentence" not in text  # the old rule pushed facts out of stubs


# --- Sentence-indexed evidence mode (issue 13 item 3) -----------------------------------------

from kitune.programs.sentences import numbered_text, sentence_spans  # noqa: E402

LONG = (
    "Acme Corp was founded in 1999 by Jane Roe.\u00a0It is headquartered in Springfield. "
    "Its CEO, Dr. Ann Lee, joined in 2010.\nRevenue reached $3.5 billion in 2023."
)


def test_sentences_are_numbered_with_exact_offsets() -> None:
    spans = sentence_spans(LONG)
    assert [LONG[s:e] for s, e in spans] == [
        "Acme Corp was founded in 1999 by Jane Roe.",
        "It is headquartered in Springfield.",
        "Its CEO, Dr.",
        "Ann Lee, joined in 2010.",
        "Revenue reached $3.5 billion in 2023.",
    ]
    assert numbered_text(LONG, spans).splitlines()[1] == "[2] It is headquartered in Springfield."


def _cite(subject: str, predicate: str, obj: str, cited: object) -> dict[str, object]:
    rec = fact(subject, predicate, obj, "")
    del rec["evidence_span"]
    return {**rec, "evidence_sentences": cited}


def test_sentence_mode_copies_the_cited_sentences_verbatim() -> None:
    doc = Document(docid="d7", text=LONG, title="Acme Corp")
    reply = [
        _cite("Acme Corp", "founded_in", "1999", [1]),
        _cite("Acme Corp", "headquartered_in", "Springfield", "2"),
        _cite("Ann Lee", "position_held", "CEO", [3, 4]),  # an abbreviation split: both cited
        _cite("Acme Corp", "revenue", "$3.5 billion", [5, 1]),  # not consecutive: the first cited kept
        _cite("Acme Corp", "founded_by", "Jane Roe", [9]),  # no such sentence: rejected
    ]
    lm = DummyLM([{"facts": json.dumps(reply)}])
    with dspy.context(lm=lm):
        result = FactExtractor(evidence_mode="sentences").extract_document(doc, now=NOW)
    prompt = lm.history[-1]["messages"][-1]["content"]
    assert "[2] It is headquartered in Springfield." in prompt
    assert result.status == "ok"
    assert [k.payload.evidence[0] for k in result.kis] == [
        "Acme Corp was founded in 1999 by Jane Roe.",
        "It is headquartered in Springfield.",
        "Its CEO, Dr. Ann Lee, joined in 2010.",
        "Revenue reached $3.5 billion in 2023.",
    ]
    assert all(k.payload.evidence[0] in LONG for k in result.kis)
    assert result.counters["evidence_sentences_trimmed"] == 1
    assert result.counters["bad_sentence_number"] == 1
    assert result.counters["records_rejected"] == 1
    assert [n for n, _ in FactExtractor(evidence_mode="sentences").named_predictors()] == ["extract"]


def test_unknown_evidence_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="evidence_mode='verbatim'"):
        FactExtractor(evidence_mode="verbatim")


def test_sentence_calls_ask_about_each_numbered_sentence_and_keep_every_answer() -> None:
    # issue 22: call_unit="sentence" — one call per numbered sentence, the chunk as context
    doc = Document(docid="d8", text=LONG, title="Acme Corp")
    by_sentence = {
        1: [_cite("Acme Corp", "founded_in", "1999", [1]), _cite("Acme Corp", "founded_by", "Jane Roe", [1])],
        2: [_cite("Acme Corp", "headquartered_in", "Springfield", [1, 2])],  # 'It' needs sentence 1
        3: [_cite("Ann Lee", "position_held", "CEO", [3, 4])],
        4: [_cite("Ann Lee", "position_held", "CEO", [3, 4])],  # the same fact again: a duplicate
        5: [],
    }
    lm = DummyLM([{"facts": json.dumps(by_sentence[n])} for n in range(1, 6)])
    with dspy.context(lm=lm):
        extractor = FactExtractor(evidence_mode="sentences", call_unit="sentence")
        result = extractor.extract_document(doc, now=NOW)
    sent = [h["messages"][-1]["content"] for h in lm.history]
    assert len(sent) == 5  # one call per sentence of LONG
    for n, prompt in enumerate(sent, 1):
        assert "[2] It is headquartered in Springfield." in prompt  # the whole chunk as context
        assert re.search(rf"\[\[ ## sentence ## \]\]\s*\n{n}\n", prompt), prompt
    assert result.status == "ok" and result.counters["lm_calls"] == 5
    assert [(k.payload.properties.predicate, k.payload.evidence[0]) for k in result.kis] == [
        ("founded_in", "Acme Corp was founded in 1999 by Jane Roe."),
        ("founded_by", "Acme Corp was founded in 1999 by Jane Roe."),
        (
            "headquartered_in",
            "Acme Corp was founded in 1999 by Jane Roe.\u00a0It is headquartered in Springfield.",
        ),
        ("position_held", "Its CEO, Dr. Ann Lee, joined in 2010."),
    ]
    assert result.drops == {"duplicate": 1}
    assert [n for n, _ in extractor.named_predictors()] == ["extract"]
    assert extractor.prompt_version == FactExtractor(evidence_mode="sentences").prompt_version


def test_sentence_calls_need_sentence_evidence_and_a_malformed_sentence_reply_fails_the_document() -> None:
    with pytest.raises(ValueError, match="call_unit='paragraph'"):
        FactExtractor(evidence_mode="sentences", call_unit="paragraph")
    with pytest.raises(ValueError, match="set evidence_mode='sentences'"):
        FactExtractor(call_unit="sentence")
    with pytest.raises(ConfigError, match=r"extraction\.call_unit=sentence"):
        load_config(overrides={"extraction.call_unit": "sentence"})
    cfg = load_config(overrides={"extraction.call_unit": "sentence", "extraction.evidence_mode": "sentences"})
    assert FactExtractor.from_config(cfg).call_unit == "sentence"
    ok = {"facts": json.dumps([_cite("Acme Corp", "founded_in", "1999", [1])])}
    lm = DummyLM([ok, {"facts": "I cannot tell."}, {"facts": "Still no JSON."}])
    with dspy.context(lm=lm):
        result = FactExtractor(evidence_mode="sentences", call_unit="sentence").extract_document(DOC, now=NOW)
    assert result.status == "failed" and result.kis == ()  # sentence 2 stayed malformed after its retry
    assert result.counters["lm_calls"] == 3 and result.counters["parse_failures"] == 2


def test_format_comes_from_the_types_json_object_schema_for_the_local_server() -> None:
    with StubServer() as stub:
        stub.push(Reply.ok(json.dumps({"facts": [FOUNDED, HQ]})))
        reset_format_memory()
        with dspy.context(
            lm=stub_server_lm(stub.base_url, is_local=True, model="openai/local", api_key="sk-local")
        ):
            result = FactExtractor("Extract the facts.").extract_document(DOC, now=NOW)
        body = stub.chat_requests[0].body
    rf = body["response_format"]
    assert rf["type"] == "json_object"  # llama.cpp's grammar-constrained JSON mode
    item = rf["schema"]["properties"]["facts"]["items"]
    item = rf["schema"]["$defs"][item["$ref"].rsplit("/", 1)[-1]] if "$ref" in item else item
    required = {"title", "subject", "predicate", "object", "evidence_span", "confidence"}
    assert required <= set(item["properties"])
    # the instruction was only "Extract the facts.": the format reached the model anyway
    assert "evidence_span" in body["messages"][0]["content"]
    assert [k.payload.properties.object for k in result.kis] == ["1999", "Springfield"]


def test_dialogue_session_is_shown_by_turn_and_its_kis_carry_turn_ids_and_the_session_date() -> None:
    # issue 17: a chat session (LoCoMo layout) — the model sees turns by id with relative dates
    # resolved against the session date; the KIs carry the evidence turn (d1-2) and the date
    text = (
        "Session 1 (1:56 pm on 8 May, 2023)\n"
        "[D1:1] Caroline: Hey Mel! How have you been?\n"
        "[D1:2] Melanie: Great! I ran a charity race for mental health yesterday.\n"
    )
    doc = Document(
        docid="conv-26-s1", text=text, title="Session 1", metadata={"date": "1:56 pm on 8 May, 2023"}
    )
    race = fact(
        "Melanie",
        "participated_in",
        "charity race for mental health",
        "I ran a charity race for mental health yesterday.",
    )
    lm = DummyLM([{"facts": json.dumps([race])}])
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(doc, now=NOW)
    assert result.status == "ok" and len(result.kis) == 1
    shown = str(lm.history[-1]["messages"])
    assert "Session date: 8 May 2023" in shown and '"yesterday" = 7 May 2023' in shown
    ki = result.kis[0]
    assert "d1-2" in ki.tags and "session-2023-05-08" in ki.tags
    assert ki.payload.evidence == ["I ran a charity race for mental health yesterday."]  # verbatim


def test_sentence_mode_on_a_dialogue_cites_turn_numbers_and_copies_the_turn_verbatim() -> None:
    # issue 17: with evidence_mode=sentences a chat session is shown as numbered turns; the cited
    # number becomes "Speaker: text" of that turn (verbatim), tagged with its turn id and date
    text = (
        "Session 1 (1:56 pm on 8 May, 2023)\n"
        "[D1:1] Caroline: Hey Mel! How have you been?\n"
        "[D1:2] Melanie: Great! I ran a charity race for mental health yesterday.\n"
    )
    doc = Document(docid="s1", text=text, title="Session 1", metadata={"date": "1:56 pm on 8 May, 2023"})
    record = {
        "title": "Melanie ran a charity race on 7 May 2023",
        "subject": "Melanie",
        "predicate": "participated_in",
        "object": "charity race for mental health",
        "description": "Melanie ran a charity race for mental health on 7 May 2023.",
        "evidence_sentences": [2],
        "confidence": 90,
    }
    lm = DummyLM([{"facts": json.dumps([record])}])
    with dspy.context(lm=lm):
        result = FactExtractor(evidence_mode="sentences").extract_document(doc, now=NOW)
    shown = lm.history[-1]["messages"][-1]["content"]
    assert "[2] Melanie: Great! I ran a charity race" in shown and '- [2] "yesterday" = 7 May 2023' in shown
    assert result.status == "ok" and len(result.kis) == 1, result
    ki = result.kis[0]
    assert ki.payload.evidence == ["Melanie: Great! I ran a charity race for mental health yesterday."]
    assert "d1-2" in ki.tags and "session-2023-05-08" in ki.tags


# --- the adapter reads the reply per record; the program reads the typed facts (issue 24) -----


def test_a_record_json_repair_had_to_fix_is_reported_and_never_kept() -> None:
    # An unescaped quote breaks one record. DSPy's own parse repairs it with json_repair and
    # would keep the guessed record; the per-record reading reports it and keeps its siblings.
    text = "Acme Corp was founded in 1999 by Jane Roe. Jane Roe said we will grow."
    bad = (
        '{"title": "Jane Roe said "we will grow"", "description": "Jane Roe said so.", '
        '"subject": "Jane Roe", "predicate": "said", "object": "growth", '
        '"evidence_span": "Jane Roe said we will grow", "confidence": 70, "tags": []}'
    )
    lm = DummyLM([{"facts": "[" + json.dumps(FOUNDED) + ", " + bad + "]"}])
    with dspy.context(lm=lm):
        result = FactExtractor().extract_document(Document(docid="d1", text=text), now=NOW)
    assert result.status == "ok"
    assert [k.payload.properties.object for k in result.kis] == ["1999"]
    assert result.counters["records_malformed"] == 1 and result.counters["records_rejected"] == 1
    assert result.counters["lm_calls"] == 1  # one valid record: not malformed, no retry
