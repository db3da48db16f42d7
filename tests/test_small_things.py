"""Small hardening items from issue 14: NUL bytes in chat prompts, bounded n-grams, paused streams on closed engines."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdec_gguf import ConfigError, EngineError


def test_a_nul_in_a_chat_prompt_is_refused_by_llama_cpp_templates_and_kept_by_jinja():
    """llama.cpp's templates take C strings: everything after a NUL vanished silently. Fails on the old
    apply_chat_template, which returned the prompt cut at the NUL."""
    from specdec_gguf.chat import BuiltinChatTemplate, JinjaChatTemplate

    with pytest.raises(EngineError, match=r"the prompt contains a NUL character \(at character 5\)"):
        BuiltinChatTemplate("chatml").render([{"role": "user", "content": "hello\0 world"}])
    jinja = JinjaChatTemplate("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    assert jinja.render([{"role": "user", "content": "hello\0 world"}]).endswith("hello\0 world")


def test_a_nul_in_a_chat_prompt_file_is_one_line_on_the_command_line(tiny_family, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_bytes(b"hello\0 world")
    done = subprocess.run([sys.executable, "-m", "specdec_cli.app", "run", "-m", str(tiny_family.target), "--chat",
                           "--chat-template", "chatml", "-f", str(prompt), "-n", "2", "--no-live"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "NUL character" in done.stderr


@pytest.mark.parametrize("flag", ["--ngram-max", "--ngram-min"])
def test_ngram_lengths_are_bounded_at_the_command_line(tiny_family, flag):
    """--ngram-max 1000000 made prompt lookup's index grow with the cube of the prompt; it is bounded to 16."""
    done = subprocess.run([sys.executable, "-m", "specdec_cli.app", "run", "-m", str(tiny_family.target),
                           "--prompt-lookup", flag, "1000000", "-p", "x", "-n", "2", "--no-live"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{flag[2:].replace('-', '_')}=1000000 must be an integer [1, 16]" in done.stderr


def test_ngram_bound_in_settings():
    from specdec_gguf.settings import MAX_NGRAM, DrafterSettings

    assert DrafterSettings(kind="prompt-lookup", ngram_max=MAX_NGRAM).ngram_max == 16
    with pytest.raises(ConfigError, match=r"ngram_max=17 must be an integer \[1, 16\]"):
        DrafterSettings(kind="prompt-lookup", ngram_max=17)


def test_a_paused_stream_collected_after_both_engines_closed(tiny_family):
    """A draft-model stream paused mid-generation, both engines closed, then the stream collected: its cleanup
    must not call into a freed llama.cpp model (run in a child, so a segfault is a failure, not a dead run)."""
    code = f"""
import gc, faulthandler
faulthandler.enable()
from specdec_gguf import SpeculativeDecoder
from specdec_gguf.drafters import AutoregressiveDrafter
from specdec_gguf.engines import LlamaCppEngine
target = LlamaCppEngine({str(tiny_family.target)!r}, n_ctx=128, n_batch=16)
draft = LlamaCppEngine({str(tiny_family.draft)!r}, n_ctx=128, n_batch=16)
stream = SpeculativeDecoder(target, AutoregressiveDrafter(draft), num_draft_tokens=3).stream(
    target.tokenize("the model is"), 40)
next(stream)
target.close()
draft.close()
del stream
gc.collect()
print("survived", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "survived" in done.stdout, done.stderr[-2000:]
