"""Chat templates: real templates render what transformers renders; the sandbox holds; tiny GGUFs carry templates.

Expected strings are written by hand from each template's semantics (the rendering
transformers' ``apply_chat_template`` produces for the same messages).
"""

from __future__ import annotations

import pytest

from specdec_gguf.chat import (BuiltinChatTemplate, JinjaChatTemplate, chat_prompt_tokens, end_of_turn_tokens,
                               load_chat_template, normalize_messages, require_template)
from specdec_gguf.errors import ChatTemplateError, ConfigError
from specdec_gguf.tiny import CHATML_TEMPLATE, CHATML_TOKENS, write_tiny_model

# Qwen2's ChatML with a default system prompt.
QWEN_CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
               "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
               "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

# A template laid out on lines, with indented block tags (trim_blocks / lstrip_blocks matter here).
LAID_OUT = """{% for message in messages %}
    {% if message['role'] == 'user' %}
U: {{ message['content'] }}
    {% else %}
A: {{ message['content'] }}
    {% endif %}
{% endfor %}
"""

# Gemma 3 instruction-tuned models' tokenizer.chat_template.
GEMMA3 = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

# Meta-Llama-3-8B-Instruct's tokenizer.chat_template.
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
          "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
          "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there "},
    {"role": "assistant", "content": " Hello."},
    {"role": "user", "content": "Make it shorter."},
]


def test_block_layout_is_trimmed_like_transformers():
    """trim_blocks + lstrip_blocks drop the newline after a block tag and the indentation before it;
    with a plain Environment the layout leaks into the prompt and this fails."""
    t = JinjaChatTemplate(LAID_OUT)
    assert t.render(CONVERSATION[1:3]) == "U: Hi there \nA:  Hello.\n"


def test_chatml_template_renders_like_transformers():
    """Qwen2's ChatML: a default system turn unless one is given, contents verbatim (not trimmed)."""
    t = JinjaChatTemplate(QWEN_CHATML)
    assert t.render(CONVERSATION[1:]) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi there <|im_end|>\n"
        "<|im_start|>assistant\n Hello.<|im_end|>\n"
        "<|im_start|>user\nMake it shorter.<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert t.render(CONVERSATION, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi there <|im_end|>\n"
        "<|im_start|>assistant\n Hello.<|im_end|>\n"
        "<|im_start|>user\nMake it shorter.<|im_end|>\n")


def test_gemma3_template_folds_the_system_prompt_into_the_first_user_turn():
    """Gemma 3 has no system role: the system text prefixes the first user turn, contents are trimmed,
    the assistant is 'model'; fails if bos_token is not passed or trim misbehaves."""
    t = JinjaChatTemplate(GEMMA3, bos_token="<bos>", eos_token="<eos>")
    assert t.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nMake it shorter.<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n")


def test_gemma3_raise_exception_becomes_a_chat_template_error():
    """raise_exception() in a template reaches the caller as ChatTemplateError with the template's words."""
    t = JinjaChatTemplate(GEMMA3, bos_token="<bos>")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_llama3_template():
    """BOS once at the start, header tokens, trimmed content, the generation header last."""
    t = JinjaChatTemplate(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    assert t.render(CONVERSATION[:2]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_sandbox_blocks_attribute_escapes_and_mutation():
    """A template from a model file is untrusted: no dunder access, no mutating the messages.
    With jinja2.Environment instead of ImmutableSandboxedEnvironment both renders succeed."""
    escape = JinjaChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        escape.render([{"role": "user", "content": "x"}])
    mutate = JinjaChatTemplate("{% set _ = messages.append({'role': 'user'}) %}ok")
    with pytest.raises(ChatTemplateError):
        mutate.render([{"role": "user", "content": "x"}])


def test_tojson_does_not_html_escape_and_helpers_exist():
    """transformers' tojson keeps '<' and non-ASCII as they are; Jinja's own would write \\u003c."""
    t = JinjaChatTemplate("{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}")
    assert t.render([{"role": "user", "content": "<b>é"}]) == '{"role": "user", "content": "<b>é"}|4'


def test_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match="line 2"):
        JinjaChatTemplate("ok\n{% for %}")


def test_normalize_messages():
    """Text parts are joined, 'developer' reads as 'system', a null assistant content is empty;
    bad input names the message."""
    out = normalize_messages([
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None},
    ])
    assert out == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                   {"role": "assistant", "content": ""}]
    with pytest.raises(ChatTemplateError, match=r"messages\[1\]\.role"):
        normalize_messages([{"role": "user", "content": "x"}, {"role": "wizard", "content": "y"}])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\]\.content\[0\]"):
        normalize_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    with pytest.raises(ChatTemplateError, match="non-empty list"):
        normalize_messages([])
    with pytest.raises(ChatTemplateError, match="content must be"):
        normalize_messages([{"role": "user", "content": 3}])


# -- with tiny GGUF models ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chat_models(tmp_path_factory):
    """Three tiny models: ChatML in the file; a Gemma-style template writing BOS itself whose end-of-turn
    marker llama.cpp does not know as end-of-generation; no template at all."""
    from specdec_gguf.engines import LlamaCppEngine

    d = tmp_path_factory.mktemp("chat")
    chatml = write_tiny_model(d / "chatml.gguf", n_layers=1, chat_template=CHATML_TEMPLATE,
                              special_tokens=CHATML_TOKENS)
    custom_template = ("{{ bos_token }}{% for m in messages %}<|turn|>{{ m['role'] }}\n{{ m['content'] }}<|end_turn|>\n"
                       "{% endfor %}{% if add_generation_prompt %}<|turn|>assistant\n{% endif %}")
    custom = write_tiny_model(d / "custom.gguf", n_layers=1, chat_template=custom_template,
                              special_tokens=("<|turn|>", "<|end_turn|>"))
    plain = write_tiny_model(d / "plain.gguf", n_layers=1)
    engines = {name: LlamaCppEngine(path, n_ctx=256, n_batch=64)
               for name, path in (("chatml", chatml), ("custom", custom), ("plain", plain))}
    yield engines
    for engine in engines.values():
        engine.close()


def test_template_from_the_file_renders_and_tokenizes_with_one_bos(chat_models):
    """The file's template is used; its markers become single special tokens; exactly one BOS even when
    the template writes bos_token itself (fails if the tokenizer's BOS is added on top)."""
    model = chat_models["chatml"]
    formatter = load_chat_template(model)
    assert isinstance(formatter, JinjaChatTemplate)
    text = formatter.render([{"role": "user", "content": "the model"}])
    assert text == "<|im_start|>user\nthe model<|im_end|>\n<|im_start|>assistant\n"
    tokens = chat_prompt_tokens(model, text)
    im_start = model.tokenize("<|im_start|>", add_bos=False, special=True)
    assert len(im_start) == 1 and tokens[:2] == [model.bos_token, im_start[0]]

    custom = chat_models["custom"]
    text = load_chat_template(custom).render([{"role": "user", "content": "hi"}])
    assert text.startswith("<s><|turn|>user")
    tokens = chat_prompt_tokens(custom, text)
    assert tokens[0] == custom.bos_token and tokens[1] != custom.bos_token


def test_end_of_turn_token_is_found_even_when_not_marked_end_of_generation(chat_models):
    """<|end_turn|> is no llama.cpp end-of-generation text, so only the template tells that it ends a
    turn; <|im_end|> is both. Fails if end_of_turn_tokens returned nothing or the newline after it."""
    custom = chat_models["custom"]
    (eot,) = end_of_turn_tokens(load_chat_template(custom), custom)
    assert custom.token_to_piece(eot, special=True) == b"<|end_turn|>" and not custom.is_eog(eot)
    chatml = chat_models["chatml"]
    (eot,) = end_of_turn_tokens(load_chat_template(chatml), chatml)
    assert chatml.token_to_piece(eot, special=True) == b"<|im_end|>" and chatml.is_eog(eot)


def test_builtin_template_by_name_and_errors(chat_models, tmp_path):
    """--chat-template NAME uses llama.cpp's own rendering; FILE reads Jinja; a model without any
    template is refused with a message that says what to do."""
    plain = chat_models["plain"]
    assert load_chat_template(plain) is None
    with pytest.raises(ChatTemplateError, match="--chat-template"):
        require_template(None, plain)
    builtin = load_chat_template(plain, "chatml")
    assert isinstance(builtin, BuiltinChatTemplate)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert builtin.render(messages) == JinjaChatTemplate(CHATML_TEMPLATE).render(messages)
    with pytest.raises(ConfigError, match="neither a file nor a llama.cpp built-in"):
        load_chat_template(plain, "no-such-template")
    file = tmp_path / "t.jinja"
    file.write_text(LLAMA3)
    from_file = load_chat_template(plain, str(file))
    assert from_file.render([{"role": "user", "content": "x"}]).startswith("<s><|start_header_id|>user")
