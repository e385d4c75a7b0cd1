"""The Lessons page's pre-class check speaks the reader's language: each claim in its own words,
its ratio and bound in the reader's numbers (a teacher found "ttft_p50 as set up / as set up" in
English on the pt-BR page: the raw metric and the lesson's English setting names)."""

from __future__ import annotations

from app.preflight import claim_lines

LESSON0 = {
    "verdict": "shows",
    "claims": [
        {
            "metric": "ttft_p50",
            "a": "as set up",
            "b": "as set up",
            "op": ">",
            "size": 5.0,
            "min": 53.23,
            "verdict": "shows",
            "claim_en": "TTFT p50 over ITL p50",
            "claim_pt": "TTFT p50 sobre ITL p50",
        }
    ],
    "offered": {"rate": 0.51, "load": 0.4, "capacity": 1.28},
}


def test_each_claim_in_the_readers_words_and_numbers():
    pt = claim_lines(LESSON0, "pt-BR")
    assert pt[0] == "- TTFT p50 sobre ITL p50: 53,23x (limite ≥ 5,00x)"
    assert pt[1] == "- tráfego: 0,4x a capacidade deste motor = 0,5 requisições/s aqui"
    assert not any("as set up" in line or "ttft_p50" in line for line in pt)
    en = claim_lines(LESSON0, "en")
    assert en[0] == "- TTFT p50 over ITL p50: 53.23x (bound ≥ 5.00x)"


def test_a_stored_check_without_the_claims_words_still_reads():
    """A preflight kept by an older Fluxo has no claim words: the metric stands in."""
    old = {
        **LESSON0,
        "claims": [{k: v for k, v in LESSON0["claims"][0].items() if "claim" not in k}],
    }
    assert claim_lines(old, "pt-BR")[0].startswith("- ttft_p50: 53,23x")
