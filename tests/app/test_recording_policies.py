"""Recordings of student policies (app/recording.py): a run made under a policy loaded from a file
(an example, and one that breaks a rule) reads back and replays with its policy's name, the hooks
it decided and its refusals; the Step by step notes read them; a record that lies about them is
refused with the line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import charts, i18n, policy_notes, recording
from app.recording import BadRecording
from engine.core import records, scheduler, schema, schema_export
from engine.core.policy import Policy, load_file, registry
from engine.core.records import StepRecord

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


class OverAdmit(Policy):
    name = "unit-overadmit"

    def admit(self, view):
        return [w.id for w in view.waiting]  # beyond the free slots when the queue is longer


@pytest.fixture(scope="module")
def policies():
    names = load_file(ROOT / "examples" / "policies" / "shortest_prompt_first.py")
    registry.register(OverAdmit)
    yield names[0]
    registry.unregister(OverAdmit.name)


def _export(make_tiny_engine, policy: str) -> str:
    e = make_tiny_engine(policy=policy, max_slots=2)
    for i, n in enumerate((11, 4, 7, 5)):
        e.submit(token_ids=[(3 * i + j) % 250 for j in range(n)], max_new_tokens=3)
    e.run_until_idle()
    return e.telemetry.jsonl()


def test_a_loaded_policys_run_reads_back_and_replays(make_tiny_engine, policies):
    run = recording.parse(_export(make_tiny_engine, policies)).run()
    assert run.config["policy"] == "shortest-first" and run.summary["throughput"] > 0
    assert {r["policy"] for r in run.steps} == {"shortest-first"}
    assert run.steps[0]["decided"] == ["admit"]
    assert charts.slot_spans(run.steps, run.people)  # the views draw it
    w = i18n.words("en")
    assert policy_notes.notes(run.steps[0], w) == [
        ("info", "`admit` of shortest\\-first decided the admission order.")
    ]
    assert "`admit` of shortest\\-first chose" in policy_notes.admitted_why(run.steps[0], w)


def test_a_broken_policys_refusals_read_back(make_tiny_engine, policies):
    run = recording.parse(_export(make_tiny_engine, OverAdmit.name)).run()
    first = run.steps[0]
    (err,) = [ev for ev in first["events"] if ev["kind"] == "policy_error"]
    assert err["hook"] == "admit" and "slots are free" in err["error"]
    assert first["decided"] == []  # refused: continuous admitted
    for lang in ("en", "pt-BR"):
        w = i18n.words(lang)
        (line,) = policy_notes.notes(first, w)
        assert line[0] == "error" and "slots are free" in line[1]
        assert policy_notes.admitted_why(first, w) == w["why_loaded_default"].format(
            policy="unit\\-overadmit"
        )


def test_a_builtins_step_gets_no_policy_notes(make_tiny_engine):
    step = recording.parse(_export(make_tiny_engine, "chunked")).run().steps[0]
    w = i18n.words("en")
    assert step["decided"] == [] and policy_notes.notes(step, w) == []
    assert policy_notes.admitted_why(step, w) == w["why_chunked"]


def test_an_older_recording_without_decided_still_replays(make_tiny_engine, policies):
    lines = _export(make_tiny_engine, policies).splitlines()
    stripped = [
        json.dumps({k: v for k, v in json.loads(x).items() if k != "decided"}) for x in lines
    ]
    step = recording.parse("\n".join(stripped) + "\n").run().steps[0]
    assert "decided" not in step and policy_notes.notes(step, i18n.words("en")) == []


@pytest.mark.parametrize(
    "decided,says",
    [
        (["admit", "rm -rf"], r"decided\[1\] must be one of token_budget"),
        ("admit", "decided must be a list of at most 4"),
        ([1], r"decided\[0\] must be one of"),
    ],
)
def test_a_record_that_lies_about_its_hooks_is_refused(make_tiny_engine, policies, decided, says):
    lines = _export(make_tiny_engine, policies).splitlines()
    first = json.loads(lines[0])
    first["decided"] = decided
    with pytest.raises(BadRecording, match=says) as info:
        recording.parse("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert info.value.line == 1


def test_the_recordings_hooks_are_the_schedulers():
    """One list: the scheduler asks the hooks the record contract (and so a recording) names."""
    hint = schema.fields(StepRecord)["decided"][0]
    assert scheduler.HOOKS is records.HOOKS
    assert tuple(schema_export.json_schema(hint)["items"]["enum"]) == scheduler.HOOKS
