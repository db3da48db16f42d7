"""`specdec run --chat`: the conversation goes through the same renderer the server uses."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specdec_cli.app import app
from specdec_gguf.chat import JinjaChatTemplate, chat_prompt_tokens
from specdec_gguf.tiny import CHATML_TEMPLATE, CHATML_TOKENS, write_tiny_model

runner = CliRunner()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("runchat")
    return {"chatml": write_tiny_model(d / "chatml.gguf", n_layers=1, chat_template=CHATML_TEMPLATE,
                                       special_tokens=CHATML_TOKENS),
            "plain": write_tiny_model(d / "plain.gguf", n_layers=1)}


def run(*args) -> object:
    return runner.invoke(app, ["run", *map(str, args)])


def test_chat_with_system_renders_both_turns(models):
    """--system adds a system turn before the prompt: the prompt is exactly the rendered ChatML
    conversation (fails if the system turn were dropped or the text sent raw)."""
    from specdec_gguf.engines import LlamaCppEngine

    result = run("-m", models["chatml"], "--system", "be brief", "-p", "the model", "-n", "4", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    with LlamaCppEngine(models["chatml"], n_ctx=256) as engine:
        text = JinjaChatTemplate(CHATML_TEMPLATE).render(
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the model"}])
        assert out["stats"]["prompt_tokens"] == len(chat_prompt_tokens(engine, text))
        assert len(chat_prompt_tokens(engine, text)) < len(engine.tokenize(text))  # markers are single tokens


def test_chat_without_a_template_says_what_to_do_and_builtin_name_works(models):
    """A file without tokenizer.chat_template is refused in one line naming --chat-template;
    with --chat-template chatml (llama.cpp's built-in) the same run works."""
    refused = run("-m", models["plain"], "--chat", "-p", "hi", "-n", "2")
    assert refused.exit_code == 1
    assert "no chat template" in refused.output and "--chat-template" in refused.output
    ok = run("-m", models["plain"], "--chat-template", "chatml", "-p", "hi", "-n", "2", "--json")
    assert ok.exit_code == 0, ok.output
    bad = run("-m", models["plain"], "--chat-template", "nonesuch", "-p", "hi", "-n", "2")
    assert bad.exit_code == 1 and "neither a file nor a llama.cpp built-in" in bad.output
