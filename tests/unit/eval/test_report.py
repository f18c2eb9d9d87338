"""`r3 report`: the HTML page's parts from a hand-made run folder (tests/report_run.py); the page in a real browser
is tests/e2e/test_report_browser.py."""

from __future__ import annotations

import json
import re

import numpy as np
from report_run import make_run

from r3_rllib.eval.plot import load_trial
from r3_rllib.eval.report import health_rows, render_report, sample_entries


def test_health_rows_give_each_check_its_latest_value_threshold_and_the_iterations_it_fired(tmp_path):
    run = make_run(tmp_path)
    rows = health_rows(load_trial(run / "R3_trial_0"))
    # Only the checks' flags are rows (not health/firing, nor the _value / _threshold columns).
    assert rows == [
        {"check": "entropy_collapse", "value": None, "threshold": None, "fired_at": []},
        {"check": "zero_advantage", "value": 0.75, "threshold": 0.95, "fired_at": [3]},
    ]


def test_sample_entries_newest_first_with_token_pieces_and_their_values(tmp_path):
    run = make_run(tmp_path)
    entries, note = sample_entries(run / "R3_trial_0")
    assert [e["iteration"] for e in entries] == [3, 3, 3, 3, 2, 2, 2, 2]
    first = entries[0]
    # The shipped tiny model's character tokenizer: id 20 and 21 are single characters.
    assert len(first["tokens"]) == 2 and all(len(t) == 1 for t in first["tokens"])
    # Stored as float32: exactly the float32 nearest the values written.
    assert first["entropy"] == [float(np.float32(0.2)), 2.5]
    assert first["is_weight"] == [1.0, float(np.float32(1.6))]
    assert {e["reason"] for e in entries} == {"exact", "wrong"}
    assert "8 samples from 2 iteration files" in note and "tokenizer pieces" in note
    assert sample_entries(run / "R3_trial_0", max_samples=3)[0].__len__() == 3


def test_the_page_is_self_contained_and_embeds_the_samples(tmp_path):
    run = make_run(tmp_path)
    page = render_report(run)
    assert "<svg" in page and "id='health'" in page and "fired at 3" in page
    assert not re.search(r"(src|href)=['\"]https?://", page)  # nothing fetched from the network
    data = re.search(r"id='samples-data'>(.*?)</script>", page, re.S).group(1)
    assert len(json.loads(data.replace("<\\/", "</"))) == 8


def test_a_run_without_records_or_health_columns_says_so(tmp_path):
    run = make_run(tmp_path)
    for f in (run / "R3_trial_0" / "samples").iterdir():
        f.unlink()
    page = render_report(run)
    assert "no sample records under" in page
