from kitune.text import exact_match, find_span, fold_text, normalize_answer, token_f1

E1_DOC = (
    "The COVID\u201119 trial (n\u2009=\u2009412) reported a \u22123.5% change\u2026 \u201cpreliminary\u201d"
    " per the board\u2019s note; effective\u00a01 May."
)
Q_OK = "The COVID-19 trial (n = 412) reported a -3.5% change... \"preliminary\" per the board's note; effective 1 May."
Q_PARA = "The COVID-19 study (n = 412) reported a -3.5% change"


def test_e1_typographic_quote_matches_and_keeps_original_slice():
    span = find_span(E1_DOC, Q_OK)
    assert span == (0, len(E1_DOC))
    assert E1_DOC[span[0]:span[1]] == E1_DOC  # the original characters, not the folded ones


def test_e1_partial_quote_offsets_point_into_original():
    start, end = find_span(E1_DOC, "reported a -3.5% change")
    assert E1_DOC[start:end] == "reported a \u22123.5% change"


def test_e1_paraphrase_is_rejected():
    assert find_span(E1_DOC, Q_PARA) is None
    assert find_span(E1_DOC, "   ") is None


def test_fold_is_idempotent():
    once = fold_text(E1_DOC)
    assert fold_text(once) == once
    assert "\u2011" not in once and "\u00a0" not in once


def test_j4_apostrophe_variants():
    gold = "O'Neill's Bakery"
    assert exact_match("O\u2019Neill\u2019s Bakery", gold)
    assert exact_match("O\u2032Neill\u2032s Bakery", gold)
    # policy: a misspelling and a spaced-out variant are not correct
    assert not exact_match("ONeills Bakery", gold)
    assert not exact_match("O Neill s Bakery", gold)
    assert normalize_answer(normalize_answer(gold)) == normalize_answer(gold)


def test_em_and_f1_normalisation():
    assert exact_match("The Norway.", ["NO", "Norway"])
    assert exact_match("1,000 people", "1000 people")
    assert token_f1("April 1793", "April 1793") == 1.0
    assert abs(token_f1("in April 1793", "April 1793") - 0.8) < 1e-9
    assert token_f1("", "x") == 0.0
