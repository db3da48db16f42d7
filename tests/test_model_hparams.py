"""Well-formed GGUF headers with absurd hyperparameters, odd file kinds, llama.cpp's own reasons (issue 14)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import gguf
import pytest

from gguf_edit import DROP, rewrite
from specdec_gguf import EngineError
from specdec_gguf.engines import LlamaCppEngine
from specdec_gguf.modelfile import summarize

F32, U32, STR = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.UINT32, gguf.GGUFValueType.STRING


@pytest.mark.parametrize("changes, message", [
    ({"llama.block_count": 0}, r"llama.block_count = 0 must be an integer \[1, 512\]"),
    ({"llama.block_count": 513}, r"llama.block_count = 513 must be an integer \[1, 512\]"),
    ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "layer_norm_rms_epsilon = nan must be a finite number"),
    ({"llama.attention.layer_norm_rms_epsilon": -0.5}, r"layer_norm_rms_epsilon = -0.5 must be >= 0"),
    ({"llama.rope.freq_base": 0.0}, r"rope.freq_base = 0.0 must be > 0"),
    ({"llama.attention.head_count": 0}, "attention.head_count = 0 must be an integer >= 1"),
    ({"llama.attention.head_count": 3, "llama.attention.head_count_kv": 3},
     "head_count = 3 must divide embedding_length = 64"),
    ({"llama.attention.head_count_kv": 0}, "head_count_kv = 0 must be >= 1 and divide"),
    ({"llama.context_length": 0}, "context_length = 0 must be an integer >= 1"),
    ({"llama.embedding_length": DROP}, "the required key 'llama.embedding_length' is missing"),
    ({"llama.expert_count": 4, "llama.expert_used_count": 0}, r"expert_used_count = 0 must be an integer \[1, 4\]"),
    ({"llama.expert_used_count": 2}, "without experts"),
    ({"llama.expert_count": 2000, "llama.expert_used_count": 2}, r"expert_count = 2000 must be an integer \[0, 1024\]"),
    ({"llama.rope.scaling.type": "bogus"}, r"rope.scaling.type = 'bogus' must be one of \['none', 'linear'"),
    ({"llama.nextn_predict_layers": 9}, r"nextn_predict_layers = 9 must lie in \[0, block_count = 1\]"),
    ({"llama.expert_count": 8, "llama.expert_used_count": 2, "llama.expert_group_count": 3,
      "llama.expert_group_used_count": 1}, "expert_group_count = 3 must divide expert_count = 8"),
])
def test_absurd_hyperparameters_are_refused_before_llama_cpp(tiny_family, tmp_path, changes, message):
    """Each of these aborted the interpreter inside llama.cpp (GGML_ASSERT) or gave NaN logits; now they
    are refused by specdec_gguf/hparams.py with the key, the value and the allowed range, for run and inspect."""
    types = {k: F32 if isinstance(v, float) else STR if isinstance(v, str) else U32
             for k, v in changes.items() if v is not DROP}
    path = rewrite(tiny_family.draft, tmp_path / "absurd.gguf", changes, types)
    with pytest.raises(EngineError, match=f"absurd.gguf: invalid hyperparameter: .*{message}"):
        LlamaCppEngine(path, n_ctx=64)
    with pytest.raises(EngineError, match=message):
        summarize(path)


def test_llama_cpps_own_reason_is_named(tiny_family, tmp_path):
    """When llama.cpp refuses a file our checks pass, the error quotes llama.cpp's reason line, not its last
    line. Fails with the old LogCapture.reason, which said only "llama_model_load_from_file_impl: failed to
    load model"."""
    path = rewrite(tiny_family.draft, tmp_path / "rope.gguf", {"llama.rope.dimension_count": 3})
    with pytest.raises(EngineError, match=r"could not load the model \(llama_model_load: error loading model: "
                                          r".*invalid n_rot: 3"):
        LlamaCppEngine(path, n_ctx=64)
    path = rewrite(tiny_family.draft, tmp_path / "shape.gguf", {}, tensor_shapes={"token_embd.weight": (733, 64)})
    with pytest.raises(EngineError, match=r"error loading model: .*token_embd.weight' has wrong shape"):
        LlamaCppEngine(path, n_ctx=64)


def test_four_byte_gguf_file_is_called_truncated(tmp_path):
    """Fails on the old message "not a GGUF file (magic b'GGUF', expected b'GGUF')"."""
    path = tmp_path / "four.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(EngineError, match=r"four.gguf: truncated: 4 bytes, but a GGUF header needs at least 24"):
        LlamaCppEngine(path)


def _special_files(tmp_path):
    fifo = tmp_path / "model.fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "model.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    return {"fifo": (fifo, "a FIFO (named pipe)"), "char device": ("/dev/zero", "a character device"),
            "socket": (sock_path, "a socket")}, sock


@pytest.mark.parametrize("kind", ["fifo", "char device", "socket"])
def test_non_regular_model_paths_are_refused_without_blocking(tmp_path, kind):
    """Fails by blocking (killed after 60 s) when a FIFO is opened before it is checked: run and inspect
    both waited for a writer forever. /dev/zero was read as 'not a GGUF file'; now all say what they are."""
    files, sock = _special_files(tmp_path)
    path, what = files[kind]
    try:
        for args in (["inspect", str(path)], ["run", "-m", str(path), "-p", "x", "--no-live"]):
            done = subprocess.run([sys.executable, "-m", "specdec_cli.app", *args], capture_output=True, text=True,
                                  timeout=60)
            assert done.returncode == 1
            assert f"is {what}, not a regular GGUF file" in done.stderr
            assert "Traceback" not in done.stderr
    finally:
        sock.close()


@pytest.mark.parametrize("duplicate", [b"\xe2\x96\x81the", b"\xe2\x96\x81the\x00junk"])
def test_a_vocabulary_with_a_token_twice_is_refused(tiny_family, tmp_path, duplicate):
    """llama.cpp aborts (GGML_ASSERT in llama-vocab.cpp) when two entries of tokenizer.ggml.tokens read the
    same as C strings, which includes an entry whose bytes go on after a NUL. Run in a child: it used to
    kill the interpreter (found by the byte fuzz with other seeds)."""
    import gguf as gguf_module

    reader = gguf_module.GGUFReader(str(tiny_family.draft))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]) for i in field.data]
    at = tokens.index(b"\xe2\x96\x81the")
    tokens[at + 1] = duplicate
    path = rewrite(tiny_family.draft, tmp_path / "dup.gguf", {"tokenizer.ggml.tokens": tokens})
    code = ("import sys\nfrom specdec_gguf import EngineError\nfrom specdec_gguf.engines import LlamaCppEngine\n"
            "try:\n    LlamaCppEngine(sys.argv[1], n_ctx=64)\nexcept EngineError as err:\n    print(err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-500:]
    assert f"corrupted header: 'tokenizer.ggml.tokens' holds b'\\xe2\\x96\\x81the' twice (entries {at} and {at + 1})" \
        in done.stdout


def test_empty_vocabulary_entries_are_not_taken_for_a_token_twice(tiny_family, tmp_path):
    """llama.cpp renames empty entries, so two of them (or one that starts with a NUL) are no duplicate: the
    check, which compares the entries at C speed where none holds a NUL, must not refuse them. Fails if empty
    entries were compared as texts."""
    from specdec_gguf.modelfile import validate_gguf

    reader = gguf.GGUFReader(str(tiny_family.draft))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]) for i in field.data]
    tokens[10], tokens[11], tokens[12] = b"", b"", b"\x00junk"
    path = rewrite(tiny_family.draft, tmp_path / "empty.gguf", {"tokenizer.ggml.tokens": tokens})
    assert validate_gguf(path).fields["tokenizer.ggml.tokens"] == ("array", gguf.GGUFValueType.STRING, len(tokens))
