"""tools/cta_timeline.py's reading of CTA records (CPU, hand-made records): a GDN / KDA step CTA's one
tile is word 6 and the words after it are its set-up's chain, whose links are medians from the start of
the CTAs that replay (a folding CTA has no set-up mark and is left out); a Mamba-2 CTA's words from 6 on
are all items."""

import importlib.util
import math
import os

import pytest

pytest.importorskip("torch")

TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "cta_timeline.py")


def load_tool():
    spec = importlib.util.spec_from_file_location("cta_timeline", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(tool, sm, start, end, marks):
    """A WORDS-long record: word 0 the SM, 1 the start, 2 the end, and {word: ns} marks."""
    r = [0] * tool.WORDS
    r[0], r[tool.START], r[tool.CONSUMER_END] = sm, start, end
    for word, t in marks.items():
        r[word] = t
    return r


def gdn_launch(tool, t0):
    """Three replaying CTAs (chain links 1, 2, 3 us apart by CTA) and one folding CTA (slot and cursor
    read only, far later, which must not move the medians)."""
    chain = tool.CHAIN
    rows = []
    for i, scale in enumerate((1, 2, 3)):
        start = t0 + 100 * i
        marks = {chain["slot"]: start + 500 * scale, chain["cursor read"]: start + 1000 * scale,
                 chain["token"]: start + 300 * scale, chain["keys"]: start + 1500 * scale,
                 chain["window"]: start + 2000 * scale, tool.CURSOR: start + 1200 * scale,
                 tool.SET_UP: start + 2500 * scale, tool.ITEM0: start + 2600 * scale}
        rows.append(record(tool, i, start, start + 4000 * scale, marks))
    fold_start = t0 + 50
    rows.append(record(tool, 3, fold_start, fold_start + 40000, {chain["slot"]: fold_start + 9000,
                                                                 chain["cursor read"]: fold_start + 9500,
                                                                 tool.CURSOR: fold_start + 9900}))
    return rows


def test_gdn_records_one_item_then_the_chain():
    tool = load_tool()
    rows = tool.launch_records(gdn_launch(tool, 1_000_000), one_tile=True)
    assert len(rows) == 4
    first = rows[0]
    assert first[4] == [1_000_000 + 2600]  # word 6 only: the chain's words are not items
    assert first[7]["window"] == 1_000_000 + 2000
    folding = rows[3]
    assert folding[4] == [] and folding[6] == 0 and folding[7]["slot"] == 1_000_000 + 50 + 9000


def test_gdn_chain_medians_over_replaying_ctas():
    tool = load_tool()
    launches = [tool.launch_records(gdn_launch(tool, t0), one_tile=True) for t0 in (1_000_000, 2_000_000)]
    f = tool.summarise(launches, ctas_per_sm=1, sms=4)
    # The median CTA is the one with scale 2: slot 1.0 us, cursor read 2.0, token 0.6, keys 3.0, window 4.0.
    assert f["chain_slot"] == pytest.approx(1.0)
    assert f["chain_cursor read"] == pytest.approx(2.0)
    assert f["chain_token"] == pytest.approx(0.6)
    assert f["chain_keys"] == pytest.approx(3.0)
    assert f["chain_window"] == pytest.approx(4.0)
    assert f["to_set_up"] == pytest.approx(2.6)  # cursor (2.4 us) -> set-up (5.0 us) of the median CTA
    assert f["ctas"] == 4


def test_mamba2_records_take_every_word_from_6_as_items_and_have_no_chain():
    tool = load_tool()
    r = record(tool, 0, 1000, 9000, {6: 2000, 7: 3000, 8: 4000, 9: 5000})
    rows = tool.launch_records([r, r])
    assert rows[0][4] == [2000, 3000, 4000, 5000] and rows[0][7] == {}
    f = tool.summarise([rows, [record_shift(x, 10_000) for x in rows]], ctas_per_sm=1, sms=1)
    assert all(math.isnan(f["chain_" + name]) for name in tool.CHAIN)


def record_shift(row, dt):
    cta, sm, start, end, items, cursor, set_up, chain = row
    return (cta, sm, start + dt, end + dt, [t + dt for t in items], cursor, set_up, chain)
