"""Drafters: what proposes the k tokens the target verifies each round."""

from .autoregressive import AutoregressiveDrafter
from .prompt_lookup import PromptLookupDrafter

__all__ = ["AutoregressiveDrafter", "PromptLookupDrafter"]
