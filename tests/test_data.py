"""Tests of embvar_study.data: loading, cleaning, label encoding, subsets, bundled corpus and probes."""
import hashlib, os, shutil, socket, time, warnings
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

import embvar_study.data as data_mod
import embvar_study.digests as digests_mod
import embvar_study.hub as hub_mod
from embvar_study.data import (
    MEDIUM_MAX_WORDS, PROBE_FAMILIES, SHORT_MAX_WORDS, clean_text, default_probes, load_probes, load_texts,
    probes_fingerprint, source_fingerprint, stratified_subset, train_eval_split, _largest_remainder)
from embvar_study.digests import file_sha256, folder_sha256
from embvar_study.hub import HubUnavailableError, check_hub_reachable


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


# ---------------------------------------------------------------- unusable files: one line that names the file

@pytest.mark.parametrize("name, content, pattern", [
    ("header.csv", b"text,label\n", r"has no data rows \(columns found: \['text', 'label'\]\)"),
    ("latin.csv", b"text,label\ncaf\xe9 good,1\nbad,0\n", r"is not UTF-8 text \(it contains byte 0xe9\); re-encode it as UTF-8"),
    ("latin.jsonl", b'{"text": "caf\xe9", "label": 1}\n', r"is not UTF-8 text .* re-encode it as UTF-8"),
    ("quote.csv", b'text,label\n"never closed,1\n', r"could not parse .* as CSV \(Error tokenizing data"),
    ("ragged.tsv", b"text\tlabel\na\t1\nb\t0\textra\tmore\n", r"could not parse .* as TSV \(Error tokenizing data"),
    ("broken.json", b'[{"text": "a", "label": ', r"could not parse .* as JSON"),
    ("bad.parquet", b"not a parquet file", r"could not parse .* as PARQUET"),
    ("empty.csv", b"", r"is empty \(expected a table with a text column\)"),
    ("blank.csv", b"\n\n\n", r"is empty"),
])
def test_unusable_files_fail_in_one_line_naming_the_file(tmp_path, name, content, pattern):
    path = tmp_path / name
    path.write_bytes(content)
    for load in (load_texts, load_probes):
        with pytest.raises(ValueError, match=pattern) as err:
            load(path)
        msg = str(err.value)
        assert msg.startswith("source: ") and repr(str(path)) in msg and "\n" not in msg


def test_header_only_dataframe_says_no_rows():
    with pytest.raises(ValueError, match=r"expected at least 2 classes, got 0 \(no rows\)"):
        load_texts(pd.DataFrame({"text": pd.Series([], dtype=object), "label": pd.Series([], dtype="int64")}))


def test_folder_source_is_refused_not_sent_to_the_hub(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    def must_not_be_called(*args, **kwargs):
        raise AssertionError("a folder reached datasets.load_dataset")
    monkeypatch.setattr(datasets, "load_dataset", must_not_be_called)
    folder = tmp_path / "reviews"
    folder.mkdir()
    pd.DataFrame({"text": ["a", "b"], "label": [0, 1]}).to_csv(folder / "train.csv", index=False)
    monkeypatch.chdir(tmp_path)
    expected = r"is a folder; expected a \.csv/\.tsv/\.jsonl/\.json/\.parquet file, 'bundled' or a Hub id"
    for source in ("reviews", str(folder), folder, str(folder) + "/"):
        with pytest.raises(ValueError, match="source: .*" + expected) as err:
            load_texts(source)
        assert "\n" not in str(err.value)
        with pytest.raises(ValueError, match=expected):
            source_fingerprint(source)
    with pytest.raises(ValueError, match=r"is a folder; .* 'builtin' or a DataFrame"):
        load_probes("reviews")
    with pytest.raises(FileNotFoundError, match=r"source: no such file '.*absent\.csv'"):
        load_texts(tmp_path / "absent.csv")


# ---------------------------------------------------------------- the Hub: fail fast when it cannot be reached

@pytest.fixture
def hub_mode(monkeypatch):
    "Offline mode off (conftest turns it on), no proxies, a fresh reachability cache before and after."
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HTTP_PROXY", "http_proxy",
                "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    hub_mod._connect_error.cache_clear()
    yield monkeypatch
    hub_mod._connect_error.cache_clear()


def test_unreachable_hub_dataset_fails_fast_with_alternatives(hub_mode):
    "Fast: one TCP connection attempt, bounded by the check's timeout, and `datasets.load_dataset` (minutes of retries) never called."
    datasets = pytest.importorskip("datasets")
    calls, attempts = [], []
    hub_mode.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a))
    real = socket.create_connection
    hub_mode.setattr(socket, "create_connection", lambda address, timeout=None, *a, **k: attempts.append((address, timeout))
                     or real(address, timeout, *a, **k))
    hub_mode.setenv("HF_ENDPOINT", "http://127.0.0.1:9")                  # nothing listens on the discard port
    with pytest.raises(HubUnavailableError) as err:
        load_texts("imdb")
    assert calls == [] and attempts == [(("127.0.0.1", 9), 3.0)]
    msg = str(err.value)
    assert msg.startswith("dataset 'imdb': the Hugging Face Hub (127.0.0.1:9) could not be reached") and "\n" not in msg
    assert "source='bundled'" in msg and "local file" in msg and "HF_HUB_OFFLINE=1" in msg


def test_reachable_hub_goes_on_to_load_dataset(hub_mode):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])})
    hub_mode.setattr(datasets, "load_dataset", lambda name, split: datasets.Dataset.from_dict(
        {"text": ["bad", "good"], "label": [0, 1]}, features=features))
    with socket.create_server(("127.0.0.1", 0)) as server:
        hub_mode.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert load_texts("someone/reviews").attrs["label_names"] == ["neg", "pos"]


def test_hub_check_is_cached_and_skipped_offline(hub_mode):
    calls = []
    def refuse(address, timeout):
        calls.append(address)
        raise ConnectionRefusedError("refused")
    hub_mode.setattr(socket, "create_connection", refuse)
    hub_mode.setenv("HF_ENDPOINT", "https://hub.example")
    for _ in range(3):
        with pytest.raises(HubUnavailableError, match=r"model 'm': the Hugging Face Hub \(hub\.example:443\)"):
            check_hub_reachable("model 'm'")
    assert calls == [("hub.example", 443)]                              # one connection per process and address
    hub_mode.setenv("HTTPS_PROXY", "http://proxy.example:3128")         # behind a proxy: the proxy is what must answer
    with pytest.raises(HubUnavailableError, match=r"proxy\.example:3128"):
        check_hub_reachable("model 'm'")
    assert calls[-1] == ("proxy.example", 3128)
    hub_mode.setenv("HF_HUB_OFFLINE", "1")
    check_hub_reachable("model 'm'")                                      # offline: no check at all
    assert len(calls) == 2
    with pytest.raises(ValueError, match="timeout: expected a positive number of seconds, got -1"):
        check_hub_reachable(timeout=-1)


def test_hub_check_is_bounded_by_its_timeout_even_if_connecting_hangs(hub_mode):
    "The check gives up while the connection attempt is still hanging: it does not wait for the attempt to end."
    import threading
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    def hang(address, timeout):                                        # e.g. a DNS lookup that never answers
        started.set()
        release.wait(120)                                              # a generous bound: the test fails, not hangs
        ended.set()
        raise OSError("gave up")
    hub_mode.setattr(socket, "create_connection", hang)
    hub_mode.setenv("HF_ENDPOINT", "https://hub.example")
    try:
        with pytest.raises(HubUnavailableError, match=r"no answer within 0\.5 s"):
            check_hub_reachable("dataset 'imdb'", timeout=0.5)
        assert started.is_set() and not ended.is_set()                 # the attempt began and was still hanging
    finally:
        release.set()


# ---------------------------------------------------------------- content fingerprints

def _age(path, seconds=3600):
    "Set a file's times into the past (a file last modified long ago, whose digest is cached)."
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_file_sha256_cache(tmp_path, monkeypatch):
    reads = []
    real = digests_mod.fresh_sha256
    monkeypatch.setattr(digests_mod, "fresh_sha256", lambda p: reads.append(p) or real(p))
    f = tmp_path / "w.bin"
    f.write_bytes(b"\x00" * 1000)
    assert file_sha256(f) == hashlib.sha256(b"\x00" * 1000).hexdigest() and len(reads) == 1
    assert file_sha256(f) and len(reads) == 2                          # modified just now: not trusted to the cache
    _age(f)
    file_sha256(f); file_sha256(f); file_sha256(str(f))
    assert len(reads) == 3                                              # old and unchanged: read once
    f.write_bytes(b"\x00" * 999 + b"\x01")                              # same size, last byte changed
    assert file_sha256(f) == hashlib.sha256(b"\x00" * 999 + b"\x01").hexdigest() and len(reads) == 4
    _age(f, 7200)                                                        # touched (mtime changed), same bytes
    file_sha256(f)
    assert len(reads) == 5
    g = tmp_path / "g.bin"
    g.write_bytes(b"\x00" * 999 + b"\x02")
    _age(g, 7200)
    os.replace(g, f)                                                     # atomic replacement: same size and mtime, new inode
    assert file_sha256(f) == hashlib.sha256(b"\x00" * 999 + b"\x02").hexdigest()


def test_source_fingerprint_follows_content_not_path(tmp_path):
    a = tmp_path / "a.csv"
    a.write_bytes(b"text,label\nfine film,1\ndull film,0\n")
    b = tmp_path / "copy" / "b.csv"
    b.parent.mkdir()
    shutil.copy(a, b)
    fa, fb = source_fingerprint(a), source_fingerprint(str(b))
    assert fa == {"kind": "file", "path": str(a.resolve()), "sha256": hashlib.sha256(a.read_bytes()).hexdigest(),
                  "bytes": a.stat().st_size}
    assert fb["sha256"] == fa["sha256"] and fb["path"] != fa["path"]  # same bytes at another path: same digest
    a.write_bytes(b"text,label\nfine film,1\ndull film,1\n")            # one byte changed, same size
    assert source_fingerprint(a)["sha256"] == hashlib.sha256(a.read_bytes()).hexdigest() != fa["sha256"]
    assert source_fingerprint("bundled")["sha256"] == hashlib.sha256(data_mod._resource("mini_corpus.csv").read_bytes()).hexdigest()
    assert source_fingerprint("imdb") == {"kind": "hub", "id": "imdb", "split": "train", "revision": "main"}
    assert source_fingerprint("imdb", split="test", revision="abc123")["revision"] == "abc123"
    with pytest.raises(FileNotFoundError, match="no such file"):
        source_fingerprint(tmp_path / "absent.csv")
    with pytest.raises(ValueError, match="got DataFrame"):
        source_fingerprint(pd.DataFrame({"text": ["a"]}))


def test_probes_fingerprint(tmp_path):
    builtin = probes_fingerprint("builtin")
    assert builtin == {"kind": "builtin", "sha256": hashlib.sha256(data_mod._resource("probes.csv").read_bytes()).hexdigest()}
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "A calm film."}\n')
    assert probes_fingerprint(f)["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    held = probes_fingerprint(f"heldout:{f}:train")
    assert held == {"kind": "heldout", "source": source_fingerprint(f), "split": "train"}
    assert probes_fingerprint("heldout:imdb")["source"] == {"kind": "hub", "id": "imdb", "split": "test", "revision": "main"}
    assert probes_fingerprint("heldout", dataset="bundled")["source"] == source_fingerprint("bundled")
    with pytest.raises(ValueError, match="dataset: expected the run's dataset"):
        probes_fingerprint("heldout")
    with pytest.raises(ValueError, match="is a folder"):
        probes_fingerprint(tmp_path)


def test_heldout_probes_record_the_split_they_are_drawn_from(tmp_path):
    # a bare `heldout` probe set is rows of the run's own dataset and split (train.prepare_data); the record names that split
    from embvar_study.config import TrainConfig
    from embvar_study.train import prepare_data
    rows = load_texts("bundled")
    f = tmp_path / "d.csv"
    rows.assign(text=rows["text"] + " (own file)").to_csv(f, index=False)
    cfg = TrainConfig(model="tiny-distilbert", dataset=str(f), split="train", probes="heldout", n_train=32, n_eval=16, n_probes=8)
    _, _, probes = prepare_data(cfg)
    assert set(probes["text"]) <= set(load_texts(str(f), split=cfg.split)["text"])   # drawn from this split of this file
    rec = cfg.resolved()["probes"]
    assert rec == {"kind": "heldout", "source": source_fingerprint(f, split=cfg.split), "split": cfg.split}
    assert rec["split"] != "test"


def test_folder_sha256(tmp_path):
    (tmp_path / "m" / "sub").mkdir(parents=True)
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "sub" / "w.bin").write_bytes(b"\x01\x02")
    before = folder_sha256(tmp_path / "m")
    shutil.copytree(tmp_path / "m", tmp_path / "elsewhere")
    assert folder_sha256(tmp_path / "elsewhere") == before               # content, not location
    (tmp_path / "m" / ".cache").mkdir()
    (tmp_path / "m" / ".cache" / "download.lock").write_text("x")
    assert folder_sha256(tmp_path / "m") == before                        # hidden entries are not content
    (tmp_path / "m" / "sub" / "w.bin").write_bytes(b"\x01\x03")
    assert folder_sha256(tmp_path / "m") != before
