"""Native model formats: a local Hugging Face directory as ``model:`` (config.json, tokenizer files,
*.safetensors) for the engines whose profile reads it, its context from config.json, its chat
template, and its own tokenizer where a profile counts with it (``tokenize.route: model``).

The directory is made here (tests/engines/hf_model.py: no download); its tokenizer and template are
the fake server's, so its counts can be checked against the fake's own byte-level encoding.
"""

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, processors

from pairbench.core import config as pb_config
from pairbench.core import models as pb_models
from pairbench.core.config import ConfigError
from pairbench.engines.adapter import ArmEngine
from pairbench.engines.chat import render_chat_prompt
from pairbench.engines.policy import check_engines
from pairbench.engines.profiles import EngineError, load_profile

from tests.fakes.openai_compat import encode, render

from .fake_serve_support import PROFILES
from .hf_model import CHAT_TEMPLATE, make_tiny_hf

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "Session 7.\n\nThe baker opens   the wooden bridge, ünd more.\n"}]


@pytest.fixture
def tiny(tmp_path) -> Path:
    return make_tiny_hf(tmp_path / "tiny-hf")


def cfg(model: str, **arms) -> dict:
    return {"label": "t", "model": model, "arms": arms, "lengths": [480], "output_tokens": 8, "rounds": 2, "seed": 0}


def test_a_directory_with_config_json_is_a_hugging_face_model(tiny):
    (tiny / ".cache" / "huggingface").mkdir(parents=True)  # what `huggingface-cli download --local-dir` leaves
    (tiny / ".cache" / "huggingface" / "x.lock").write_text("")
    info = pb_models.resolve_model(str(tiny), REPO)
    assert info == {"name": "tiny-hf", "kind": "hf", "path": str(tiny)}
    assert pb_models.resolve_model("tiny-hf", tiny.parent) == info  # relative to the checkout
    assert pb_models.model_context(str(tiny), REPO) == 2048  # config.json's max_position_embeddings
    assert [Path(f).name for f in pb_models.model_files(info)] == ["config.json", "model.safetensors",
                                                                   "tokenizer.json", "tokenizer_config.json"]


def test_what_is_not_a_model_is_named(tiny, tmp_path):
    (tiny / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"^model: directory .*tiny-hf has no config\.json \(a Hugging Face model "
                                          r"directory holds config\.json, the tokenizer files and \*\.safetensors\)$"):
        pb_models.resolve_model(str(tiny), REPO)
    with pytest.raises(ConfigError, match=r"^model: 'Qwen/Qwen2\.5-0\.5B-Instruct' is neither a known model "
                                          r"\(smollm2-135m, tiny\), nor a path to a \.gguf file, nor a Hugging Face "
                                          r"model directory \(a folder with config\.json\); if it is a Hugging Face "
                                          r"model id, pairbench does not download it: fetch it into a folder first "
                                          r"\(huggingface-cli download Qwen/Qwen2\.5-0\.5B-Instruct --local-dir "
                                          r"resources/Qwen2\.5-0\.5B-Instruct\) and give that folder$"):
        pb_models.resolve_model("Qwen/Qwen2.5-0.5B-Instruct", tmp_path)
    make_tiny_hf(tmp_path / "nolen")
    (tmp_path / "nolen" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConfigError, match=r"^model: .*nolen/config\.json states no context length"):
        pb_models.model_context(str(tmp_path / "nolen"), REPO)


def test_the_context_of_a_directory_bounds_the_lengths(tiny):
    pb_config.check_config(cfg(str(tiny), a={"engine": "vllm"}, b={"engine": "vllm", "threads": 2}), REPO)
    with pytest.raises(ConfigError, match=r"^lengths\[0\]: 2100 input \+ 8 output tokens \(\+16 margin\) exceed the "
                                          r"context of model '.*tiny-hf' \(2048\)$"):
        pb_config.check_config({**cfg(str(tiny), a={"engine": "vllm"}, b={"engine": "vllm"}), "lengths": [2100]}, REPO)


def test_each_engine_takes_the_formats_its_profile_declares(tiny, tmp_path):
    check_engines(cfg(str(tiny), a={"engine": "vllm"}, b={"engine": "sglang"}))
    check_engines(cfg(str(tmp_path / "m.gguf"), a={"engine": "vllm"}, b={"engine": "llama-server"}))
    with pytest.raises(ConfigError, match=rf"^model: '{tiny}' is a Hugging Face model directory, but arm b's engine "
                                          r"llama-server reads a GGUF file only \(model_formats in "
                                          r"config/engines/llama-server\.yaml\)$"):
        check_engines(cfg(str(tiny), a={"engine": "vllm"}, b={"engine": "llama-server"}))
    with pytest.raises(ConfigError, match=r"^model: .* is a Hugging Face model directory, but arm a's engine embedded "
                                          r"reads a GGUF file or a named built-in model only"):
        check_engines(cfg(str(tiny), a={}, b={}))


def test_the_chat_template_comes_from_the_directory(tiny):
    assert render_chat_prompt(tiny, MESSAGES) == render(MESSAGES)  # the fake server's own template
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    # transformers' named templates: the default one
    config["chat_template"] = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": CHAT_TEMPLATE}]
    (tiny / "tokenizer_config.json").write_text(json.dumps(config))
    assert render_chat_prompt(tiny, MESSAGES) == render(MESSAGES)
    (tiny / "chat_template.jinja").write_text("{{ eos_token }}|{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert render_chat_prompt(tiny, MESSAGES) == "<|im_end|>|" + MESSAGES[0]["content"]  # the file wins
    (tiny / "chat_template.jinja").unlink()
    del config["chat_template"]
    (tiny / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match=r"^model: .*tiny-hf has no chat template \(chat_template\.jinja, or "
                                          r"chat_template in tokenizer_config\.json\)$"):
        render_chat_prompt(tiny, MESSAGES)


def engine(profile, model: Path) -> ArmEngine:
    return ArmEngine(profile, {}, model=str(model), model_path=str(model), ctx=2048, src_dir=model.parent)


def test_a_profile_may_count_with_the_directorys_own_tokenizer(tiny, tmp_path):
    profile = load_profile("fake-serve", root=PROFILES)
    eng = engine(profile, tiny)
    assert eng.tokenizes_locally
    # no server is asked (no HTTP client, no URL): the directory's tokenizer.json, over the template's text
    assert eng.tokenize(None, None, MESSAGES) == encode(render(MESSAGES))
    with pytest.raises(EngineError, match=r"^engine fake-serve: tokenize\.route model needs a Hugging Face model "
                                          r"directory, not '.*/m\.gguf'$"):
        engine(profile, tmp_path / "m.gguf").tokenize(None, None, MESSAGES)
    assert not engine(load_profile("vllm"), tiny).tokenizes_locally


def test_special_tokens_are_added_in_completions_mode_only(tiny, tmp_path):
    """A completions request's prompt gets the tokenizer's special tokens (BOS, say); a chat
    template holds its own, so nothing is added after it: as vLLM and SGLang tokenize."""
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    bos = tmp_path / "bos-hf"
    shutil.copytree(tiny, bos)
    tok.save(str(bos / "tokenizer.json"))
    data = load_profile("fake-serve", root=PROFILES).data
    completions = type(load_profile("fake-serve", root=PROFILES))(
        name="fake-serve", data={**data, "api": {**data["api"], "mode": "completions"},
                                 "tokenize": {**data["tokenize"], "input": "text"}})
    assert engine(completions, bos).tokenize(None, None, MESSAGES) == [0, *encode(render(MESSAGES))]
    assert engine(load_profile("fake-serve", root=PROFILES), bos).tokenize(None, None, MESSAGES) == encode(render(MESSAGES))
