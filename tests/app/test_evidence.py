"""Evidence a student hands in (app/evidence.py, app/evidence_check.py): the zip opens in pandas
and its tables match the real records; no client's name leaves in it; the checker accepts the
page's export as downloaded (a real run, a Step by step range, Live's clipped buffer, lesson 3's
recording) and rejects one doctored anywhere; an assignment's claim is graded on its own numbers."""

from __future__ import annotations

import copy
import io
import json
import tomllib
import zipfile
from pathlib import Path

import pandas as pd
import pytest

from app import evidence, recording
from app import evidence_check as ec

ROOT = Path(__file__).resolve().parents[2]
ASSIGNMENT = ROOT / "lessons" / "assignments" / "01-does-chunking-pay"


def _doc(runs, policy: str = "continuous") -> dict:
    steps, requests = runs[policy]
    src = evidence.Source(policy, {"policy": policy, "max_slots": 4}, steps, requests)
    return evidence.build("live", [src], {"weights": "fp32"})


def _unzip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


@pytest.mark.parametrize("policy", ["static", "chunked", "async"])
def test_the_tables_open_in_pandas_and_match_the_records(runs, policy):
    steps, requests = runs[policy]
    files = _unzip(evidence.to_zip(_doc(runs, policy)))
    st = pd.read_csv(io.BytesIO(files["steps.csv"]))
    rq = pd.read_csv(io.BytesIO(files["requests.csv"]))
    cf = pd.read_csv(io.BytesIO(files["configs.csv"]))
    assert list(st["step"]) == [s["step"] for s in steps]
    assert st["decode_tokens"].sum() == sum(s["tokens"]["decode"] for s in steps)
    assert st["prefill_tokens"].sum() == sum(s["tokens"]["prefill"] for s in steps)
    assert (
        (st["prefill_rows"] + st["decode_rows"] + st["dead_rows"] + st["idle_slots"])
        .eq([len(s["slots"]) for s in steps])
        .all()
    )
    by_id = {r["id"]: r for r in requests}
    assert sorted(rq["id"]) == sorted(by_id)
    for row in rq.itertuples():
        r = by_id[row.id]
        assert row.output_tokens == len(r["token_times"])
        assert row.ttft_s == pytest.approx(r["first_token"] - r["arrival"], abs=1e-6)
    assert int(cf["useful_tokens"][0]) == sum(len(r["token_times"]) for r in requests)
    assert int(cf["steps"][0]) == len(steps)


def test_no_client_name_leaves_in_the_export(runs):
    steps, requests = runs["continuous"]
    named = [{**r, "client": f"http:10.0.0.{r['id'] % 7}"} for r in requests]
    named[0]["client"] = "c7"
    data = evidence.to_zip(evidence.build("live", [evidence.Source("live", {}, steps, named)]))
    text = b"".join(_unzip(data).values())
    assert b"10.0.0." not in text and b"c7" not in text
    doc = json.loads(_unzip(data)["evidence.json"])
    assert {r["source"] for r in doc["tables"]["requests"]} == {"person"}


def test_the_checker_accepts_the_export_as_downloaded(runs):
    for policy in ("static", "chunked", "async"):
        doc, csvs, _ = ec.read(evidence.to_zip(_doc(runs, policy)))
        assert ec.problems(doc, csvs) is None, policy


def test_a_step_by_step_range_and_a_clipped_buffer_check_too(runs):
    """Step by step exports the steps up to one; Live exports a ring buffer whose first steps
    are gone and whose page skipped some: tokens outside are clipped, gaps admitted."""
    steps, requests = runs["continuous"]
    middle = steps[: len(steps) // 2]
    ranged = evidence.build(
        "step", [evidence.Source("s", {}, middle, evidence.window(middle, requests))]
    )
    assert ec.problems(ranged, {}) is None
    states = {r["status"] for r in ranged["tables"]["requests"]}
    assert "finished" in states and states & {"running", "queued"}
    ring = steps[len(steps) // 3 :]
    ring = [s for i, s in enumerate(ring) if i % 5 != 2]  # the page skipped every fifth
    clipped = evidence.window(ring, requests)
    assert (
        ec.problems(evidence.build("live", [evidence.Source("l", {}, ring, clipped)]), {}) is None
    )


def test_a_doctored_export_is_rejected(runs):
    data = evidence.to_zip(_doc(runs))
    doc, csvs, _ = ec.read(data)

    def edited(change) -> str | None:
        d, c = copy.deepcopy(doc), dict(csvs)
        change(d, c)
        return ec.problems(d, c)

    def table(d, c):
        d["tables"]["configs"][0]["itl_p99"] *= 0.5

    def csv_only(d, c):
        c["configs.csv"] = c["configs.csv"].replace(",continuous,", ",chunked,", 1) + "\n"

    def record_and_tables(d, c):  # a token moved past the run, tables rebuilt to match
        d["records"]["continuous"]["requests"][2]["token_times"][-1] += 30.0
        d["tables"] = json.loads(json.dumps(evidence.tables(ec.sources(d))))
        for table, name in evidence.FILES.items():  # and the CSV files too
            c[name] = evidence.csv_text(d["tables"][table], evidence.COLUMNS[table])

    def broken_record(d, c):
        d["records"]["continuous"]["steps"][3]["step"] = -1

    assert "itl_p99" in edited(table)
    assert "configs.csv" in edited(csv_only)
    assert "in no step" in edited(record_and_tables)
    assert "do not validate" in edited(broken_record)
    assert "not Fluxo evidence" in edited(lambda d, c: d.update(format="other"))


def _hand_in(tmp_path: Path, rec: recording.Recording, claim: str) -> Path:
    folder = tmp_path / "student"
    folder.mkdir(exist_ok=True)
    (folder / "fluxo-evidence.zip").write_bytes(evidence.to_zip(evidence.from_recording(rec)))
    (folder / "claim.toml").write_text(claim)
    return folder


def _claim(doc: dict, verdict: str, itl_scale: float = 1.0) -> str:
    r = doc["tables"]["ratios"]
    return (
        f"itl_p99_b_over_a = {itl_scale * r['itl_p99_b_over_a']:.2f}\n"
        f"throughput_b_over_a = {r['throughput_b_over_a']:.2f}\nverdict = {verdict!r}\n"
    )


def test_an_assignment_is_graded_on_the_students_own_numbers(tmp_path, capsys):
    spec = tomllib.loads((ASSIGNMENT / "assignment.toml").read_text())
    rec = recording.load(ROOT / "lessons" / "03-admission-stalls" / "recording.jsonl")
    doc = evidence.from_recording(rec)
    due = ec.verdict(doc, spec)
    other = spec["rule"]["else"] if due == spec["rule"]["then"] else spec["rule"]["then"]
    folder = _hand_in(tmp_path, rec, _claim(doc, due))
    assert ec.main([str(ASSIGNMENT), str(folder)]) == 0
    assert ": supported: " in capsys.readouterr().out
    for claim, said in ((_claim(doc, other), "verdict"), (_claim(doc, due, 3.0), "itl_p99")):
        _hand_in(tmp_path, rec, claim)
        assert ec.main([str(ASSIGNMENT), str(folder)]) == 1
        out = capsys.readouterr().out
        assert ": not supported: " in out and said in out
    lesson2 = recording.load(ROOT / "lessons" / "02-oven-vs-flow" / "recording.jsonl")
    _hand_in(tmp_path, lesson2, _claim(doc, due))
    assert ec.main([str(ASSIGNMENT), str(folder)]) == 1
    assert ": rejected: workload 'batching'" in capsys.readouterr().out
