"""Tests of embvar_study.data: loading, cleaning, label encoding, subsets, bundled corpus and probes."""
import warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from embvar_study.data import (
    HubUnavailableError, MEDIUM_MAX_WORDS, PROBE_FAMILIES, SHORT_MAX_WORDS, clean_text, default_probes, load_probes,
    load_texts, stratified_subset, train_eval_split, _largest_remainder)


def _key(texts):
    "Independent normalisation used to compare texts: lower case, single spaces."
    return {" ".join(str(t).lower().split()) for t in texts}


# ---------------------------------------------------------------- load_texts

@pytest.fixture
def reviews():
    return pd.DataFrame({"body": ["Great fun.<br /><br />Loved it", "Dull and slow", "Fine", "Awful ending", "Superb cast"],
                         "verdict": ["good", "bad", "good", "bad", "good"], "other": range(5)})


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "json", "parquet", "tsv"])
def test_load_texts_file_formats(tmp_path, reviews, suffix):
    path = tmp_path / f"r.{suffix}"
    {"csv": lambda: reviews.to_csv(path, index=False),
     "tsv": lambda: reviews.to_csv(path, index=False, sep="\t"),
     "jsonl": lambda: reviews.to_json(path, orient="records", lines=True),
     "json": lambda: reviews.to_json(path, orient="records"),
     "parquet": lambda: reviews.to_parquet(path)}[suffix]()
    df = load_texts(str(path), text_col="body", label_col="verdict")
    assert list(df.columns) == ["text", "label"]
    assert df.label.dtype == np.int64
    assert isinstance(df.index, pd.RangeIndex) and df.index[0] == 0
    assert df.text.tolist()[0] == "Great fun. Loved it"                # <br /> markup became a space
    assert all(isinstance(t, str) for t in df.text)
    assert df.attrs["label_names"] == ["bad", "good"]                  # sorted string labels -> 0, 1
    assert df.label.tolist() == [1, 0, 1, 0, 1]
    assert load_texts(path, text_col="body", label_col="verdict", limit=2).label.tolist() == [1, 0]


def test_load_texts_numeric_labels_are_mapped_in_sorted_order(tmp_path):
    path = tmp_path / "stars.csv"
    pd.DataFrame({"text": list("abcdef"), "label": [5, 1, 3, 1, 5, 3]}).to_csv(path, index=False)
    df = load_texts(path)
    assert df.label.tolist() == [2, 0, 1, 0, 2, 1] and df.attrs["label_names"] == [1, 3, 5]
    pd.DataFrame({"text": list("ab"), "label": [0.5, 1.0]}).to_csv(path, index=False)
    with pytest.raises(ValueError, match="non-integer"):
        load_texts(path)


def test_load_texts_errors(tmp_path, reviews):
    path = tmp_path / "r.csv"
    reviews.to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"columns found: \['body', 'verdict', 'other'\]"):
        load_texts(path)
    with pytest.raises(ValueError, match="at least 2 classes"):
        load_texts(path, text_col="body", label_col="verdict", limit=1)
    one = tmp_path / "one.csv"
    pd.DataFrame({"text": ["a", "b", "c"], "label": [1, 1, 1]}).to_csv(one, index=False)
    with pytest.raises(ValueError, match="expected at least 2 classes, got 1"):
        load_texts(one)
    holes = tmp_path / "holes.jsonl"
    pd.DataFrame({"text": ["ok", None, "   ", "<br />", "fine"], "label": [0, 1, 0, 1, 0]}).to_json(
        holes, orient="records", lines=True)
    with pytest.raises(ValueError, match=r"got 3 missing or empty text\(s\) \(first at row 1\)"):
        load_texts(holes)
    with pytest.raises(FileNotFoundError):
        load_texts(tmp_path / "absent.csv")
    nolabel = tmp_path / "nl.csv"
    pd.DataFrame({"text": ["a", "b"], "label": [0, None]}).to_csv(nolabel, index=False)
    with pytest.raises(ValueError, match="1 missing label"):
        load_texts(nolabel)


def test_load_texts_hub_path(monkeypatch):
    "The Hub path goes through datasets.load_dataset; offline failures become HubUnavailableError."
    datasets = pytest.importorskip("datasets")
    calls = []
    def fake_ok(name, split):
        calls.append((name, split))
        features = datasets.Features({"text": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=["neg", "pos"])})
        return datasets.Dataset.from_dict({"text": ["bad<br />film", "good film", "meh"], "label": [0, 1, 0]},
                                          features=features)
    monkeypatch.setattr(datasets, "load_dataset", fake_ok)
    df = load_texts("someone/reviews", split="test")
    assert calls == [("someone/reviews", "test")]
    assert df.text.tolist() == ["bad film", "good film", "meh"] and df.attrs["label_names"] == ["neg", "pos"]

    def fake_offline(name, split):
        raise ConnectionError("Couldn't reach 'imdb' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setattr(datasets, "load_dataset", fake_offline)
    with pytest.raises(HubUnavailableError, match="could not be reached") as err:
        load_texts("imdb")
    assert "bundled" in str(err.value) and "local file" in str(err.value)
    assert isinstance(err.value, ConnectionError)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["word", " ", "  ", "\n", "<br />", "<BR/>", "<br>", "x.", "\t"]), max_size=20))
def test_clean_text_properties(parts):
    raw = "".join(parts)
    out = clean_text(raw)
    assert "<br" not in out.lower() and "  " not in out and out == out.strip()
    assert clean_text(out) == out                                        # idempotent
    assert out.split() == raw.replace("<br />", " ").replace("<BR/>", " ").replace("<br>", " ").split()


# ---------------------------------------------------------------- subsets

def _reference_quota(counts, n):
    "Hamilton apportionment with exact fractions (independent of the implementation's integer divmod)."
    total = sum(counts)
    exact = [Fraction(n * c, total) for c in counts]
    quota = [int(e) for e in exact]
    order = sorted(range(len(counts)), key=lambda k: (-(exact[k] - quota[k]), k))
    for k in order[: n - sum(quota)]:
        quota[k] += 1
    return quota


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=2, max_size=5), st.data())
def test_largest_remainder_matches_reference(counts, data):
    n = data.draw(st.integers(1, sum(counts)))
    quota = _largest_remainder(np.array(counts), n)
    assert quota.tolist() == _reference_quota(counts, n)
    assert quota.sum() == n and np.all(quota <= np.array(counts))
    assert np.all(np.abs(quota - n * np.array(counts) / sum(counts)) < 1)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=2, max_size=4), st.data(), st.integers(0, 2**31))
def test_stratified_subset_properties(counts, data, seed):
    labels = np.repeat(np.arange(len(counts)), counts)
    df = pd.DataFrame({"text": [f"r{i}" for i in range(len(labels))], "label": labels},
                      index=np.arange(len(labels)) * 10 + 7)           # non-default index is kept
    n = data.draw(st.integers(1, len(df)))
    sub = stratified_subset(df, n, seed=seed)
    assert len(sub) == n and sub.index.is_unique and set(sub.index) <= set(df.index)
    got = np.bincount(sub.label, minlength=len(counts))
    assert np.all(np.abs(got - n * np.array(counts) / len(df)) < 1)    # proportional up to rounding
    assert (df.loc[sub.index, "text"] == sub.text).all()
    again = stratified_subset(df, n, seed=seed)
    assert sub.index.tolist() == again.index.tolist()                  # deterministic, order included


def test_stratified_subset_seed_changes_rows_and_order():
    df = load_texts("bundled")
    a, b = stratified_subset(df, 60, seed=0), stratified_subset(df, 60, seed=1)
    assert set(a.index) != set(b.index)
    full = stratified_subset(df, len(df), seed=0)
    assert set(full.index) == set(df.index) and full.index.tolist() != df.index.tolist()   # all rows, shuffled
    assert a.label.value_counts().tolist() == [30, 30]
    with pytest.raises(ValueError, match="n: expected at most 400 rows"):
        stratified_subset(df, 401, seed=0)
    with pytest.raises(ValueError, match="columns found"):
        stratified_subset(df, 5, seed=0, label_col="stars")
    with pytest.raises(ValueError, match="seed"):
        stratified_subset(df, 5, seed=-1)


def test_train_eval_split():
    df = load_texts("bundled")
    tr, ev = train_eval_split(df, 250, 100, seed=3)
    assert len(tr) == 250 and len(ev) == 100
    assert not set(tr.index) & set(ev.index)
    assert not _key(tr.text) & _key(ev.text)                             # the corpus has no duplicate texts
    assert tr.label.value_counts().tolist() == [125, 125] and ev.label.value_counts().tolist() == [50, 50]
    tr2, ev2 = train_eval_split(df, 250, 100, seed=3)
    assert tr.index.tolist() == tr2.index.tolist() and ev.index.tolist() == ev2.index.tolist()
    assert set(train_eval_split(df, 250, 100, seed=4)[0].index) != set(tr.index)
    assert ev.index.tolist() == train_eval_split(df, 20, 100, seed=3)[1].index.tolist()
    with pytest.raises(ValueError, match="n_train \\+ n_eval"):
        train_eval_split(df, 350, 51, seed=0)


# ---------------------------------------------------------------- bundled corpus and probes

def test_bundled_corpus():
    df = load_texts("bundled")
    assert len(df) >= 400
    assert df.label.value_counts().to_dict() == {0: len(df) // 2, 1: len(df) // 2}
    assert len(_key(df.text)) == len(df)                                 # no duplicates, even up to case/spacing
    words = df.text.str.split().str.len()
    assert words.min() >= 5 and words.max() <= 60 and (words > 40).sum() >= 10 and (words <= 8).sum() >= 40


def test_default_probes():
    p = default_probes()
    assert list(p.columns) == ["text", "sentiment", "length_bucket", "family"]
    assert len(p) >= 128 and p.text.is_unique
    assert set(p.family) == set(PROBE_FAMILIES)
    assert p.family.value_counts().min() >= 18
    assert set(p.sentiment) <= {-1, 0, 1} and p.sentiment.dtype == np.int64
    assert (p.loc[p.family == "neutral", "sentiment"] == -1).all()
    for fam in ("plain", "negation", "sarcasm"):
        assert set(p.loc[p.family == fam, "sentiment"]) == {0, 1}
    words = p.text.str.split().str.len()
    expected = np.where(words <= SHORT_MAX_WORDS, "short", np.where(words <= MEDIUM_MAX_WORDS, "medium", "long"))
    assert p.length_bucket.tolist() == expected.tolist()
    assert (p.groupby("family").length_bucket.nunique() == 3).all()
    assert not _key(p.text) & _key(load_texts("bundled").text)           # no probe is in the mini-corpus


def test_load_probes_exclude_and_sampling():
    p = default_probes()
    train = ["  " + p.text[0].upper() + " ", p.text[5], "an unrelated training review"]
    with pytest.warns(UserWarning, match=r"removed 2 probe\(s\)"):
        out = load_probes(exclude=train)
    assert len(out) == len(p) - 2 and not _key(out.text) & _key(train)
    with pytest.warns(UserWarning, match=r"removed 1 probe"):
        assert len(load_probes(exclude=pd.DataFrame({"text": [p.text[3]]}))) == len(p) - 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_probes(exclude=["nothing in common"])) == len(p)
    with pytest.raises(ValueError, match="single str"):
        load_probes(exclude="a text")
    with pytest.raises(ValueError, match="at least 1 probe"), pytest.warns(UserWarning):
        load_probes(exclude=p.text)
    s = load_probes(n=40, seed=2)
    assert len(s) == 40 and set(s.family) == set(PROBE_FAMILIES)
    assert s.text.tolist() == load_probes(n=40, seed=2).text.tolist()
    assert s.text.tolist() != load_probes(n=40, seed=3).text.tolist()
    pos = {t: i for i, t in enumerate(p.text)}
    assert [pos[t] for t in s.text] == sorted(pos[t] for t in s.text)  # original order kept
    with pytest.raises(ValueError, match="n: expected at most"):
        load_probes(n=len(p) + 1)


def test_load_probes_from_file_and_heldout(tmp_path):
    path = tmp_path / "p.jsonl"
    pd.DataFrame({"text": ["One fine film.", "A grey sky over the sea, and nothing else at all to see here today.",
                           "One fine film."],
                  "sentiment": ["positive", "neutral", "positive"], "source_id": [10, 11, 12]}).to_json(
        path, orient="records", lines=True)
    with pytest.warns(UserWarning, match="duplicate"):
        p = load_probes(path)
    assert p.columns.tolist() == ["text", "sentiment", "length_bucket", "family", "source_id"]
    assert p.sentiment.tolist() == [1, -1] and p.family.tolist() == ["custom", "custom"]
    assert p.length_bucket.tolist() == ["short", "medium"] and p.source_id.tolist() == [10, 11]
    bare = tmp_path / "bare.csv"
    pd.DataFrame({"sentence": ["x"]}).to_csv(bare, index=False)
    with pytest.raises(ValueError, match=r"columns found: \['sentence'\]"):
        load_probes(bare)
    held = load_texts("bundled").iloc[100:200]
    h = load_probes(held, n=20, seed=0)
    assert len(h) == 20 and set(h.family) == {"heldout"} and (h.sentiment == h.label).all()
    assert h.sentiment.value_counts().tolist() == [10, 10]
    assert set(h.text) <= set(held.text)
