"""Every chart is declared once (app/charts/registry.py) and every list of charts reads it.

A chart declared in the registry but missing a builder's dataset, a title in either language, or
a twin whose rows differ from what its inline spec carries fails here; rows.js's side (a
``CHART_ROWS`` entry per registered chart, the same rows) is held in tests/app/test_rows_js.py.
"""

from __future__ import annotations

import json

import pytest

from app import browser_view, charts, i18n, ui


def inline_datasets(node, found: dict | None = None) -> dict[str, list]:
    """The datasets an inline spec carries, by name (a name carried twice, the same rows)."""
    found = {} if found is None else found
    if isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, dict) and "values" in data:
            assert found.setdefault(data["name"], data["values"]) == data["values"]
        for v in node.values():
            inline_datasets(v, found)
    elif isinstance(node, list):
        for v in node:
            inline_datasets(v, found)
    return found


def dataset_names(node, found: set[str] | None = None) -> set[str]:
    """The named datasets a spec declares (none of them may carry values)."""
    found = set() if found is None else found
    if isinstance(node, dict):
        if isinstance(node.get("data"), dict) and "name" in node["data"]:
            found.add(node["data"]["name"])
            assert "values" not in node["data"]
        for v in node.values():
            dataset_names(v, found)
    elif isinstance(node, list):
        for v in node:
            dataset_names(v, found)
    return found


def test_the_lists_of_charts_read_the_registry():
    names = tuple(c.name for c in charts.CHARTS)
    assert len(set(names)) == len(names)
    assert browser_view.ORDER == tuple(c.name for c in charts.CHARTS if c.grid)
    assert ui.CHARTS == ("all", *names)
    assert set(charts.DATASETS) == set(names) == set(charts.WINDOWS)


@pytest.mark.parametrize("chart", charts.CHARTS, ids=lambda c: c.name)
def test_each_chart_is_whole(chart):
    """Its named spec declares exactly its datasets and is valid Vega-Lite; its title reads in
    both languages; its sizes make sense."""
    named = chart.named(chart.heights[0])
    assert dataset_names(named) == set(charts.DATASETS[chart.name])
    charts.as_altair(named, validate=True)
    titles = {lang: i18n.words(lang)[chart.title] for lang in ("en", "pt-BR")}
    assert all(titles.values()), titles
    assert chart.window > 0 and all(100 <= h <= 800 for h in chart.heights)
    assert chart.heights[2] >= chart.heights[1] >= chart.heights[0]
    for _, fields in chart.datasets:
        assert fields and len(set(fields)) == len(fields)


@pytest.mark.parametrize("chart", charts.CHARTS, ids=lambda c: c.name)
@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_each_twin_gives_the_rows_its_inline_chart_draws(chart, policy, runs):
    """The registry's rows (rows.js's twin) are the rows the chart's own inline spec carries,
    dataset by dataset, and every declared key field is in every row."""
    steps, requests = runs[policy]
    people = {r["id"] for r in requests if r["client"] != "traffic"}
    kw = {"people": people} if chart.name == "slots" else {}
    inline = chart.spec(steps, last=chart.window, **kw)
    charts.as_altair(inline, validate=True)
    rows = chart.rows(steps, people, chart.window, True)
    assert set(rows) == set(charts.DATASETS[chart.name])
    carried = inline_datasets(inline)
    assert carried and set(carried) <= set(rows)
    for name, values in carried.items():
        assert json.loads(json.dumps(values)) == json.loads(json.dumps(rows[name])), name
    for name, fields in chart.datasets:
        assert all(f in r for r in rows[name] for f in fields), name


def test_named_charts_take_heights_and_each_chart_its_own_options():
    specs = charts.named_charts(
        charts.BY_NAME, {"kv": 211}, y_max_ms=900.0, slots=40, title="Slots until now"
    )
    assert set(specs) == set(charts.BY_NAME)
    assert specs["kv"]["hconcat"][0]["height"] == 211
    assert "Slots until now" in json.dumps(specs["slots"])
    assert "900" in json.dumps(specs["stalls"]) and "900" not in json.dumps(specs["kv"])
    with pytest.raises(TypeError, match="stall_max"):
        charts.named_charts(stall_max_ms=1000)  # an old or misspelt option is refused, not dropped
