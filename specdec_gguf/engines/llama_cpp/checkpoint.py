"""Rollback for memories that cannot be cut partially (recurrent/hybrid): save the sequence state, restore it."""

from __future__ import annotations

import ctypes

import llama_cpp as lc

from ...errors import RollbackUnsupportedError


class StateCheckpoint:
    """One saved copy of sequence 0's state and the cache length it was taken at.

    The engine saves before each forward that may be rejected; a rollback restores
    the copy and re-advances the committed tokens past it.
    """

    def __init__(self, what: str) -> None:
        self.what = what  # names the model in errors
        self._buf: ctypes.Array | None = None
        self._len = 0
        self.n_past = -1  # cache length at the save; -1: none

    def save(self, ctx: lc.llama_context_p, n_past: int) -> None:
        """Save the state at ``n_past`` unless a copy of exactly that is held already."""
        if self.n_past == n_past:
            return
        size = lc.llama_state_seq_get_size_ext(ctx, 0, 0)
        if self._buf is None or len(self._buf) < size:
            self._buf = (ctypes.c_uint8 * size)()
        self._len = lc.llama_state_seq_get_data_ext(ctx, self._buf, size, 0, 0)
        if self._len == 0:
            raise RollbackUnsupportedError(f"{self.what}: llama.cpp could not save the sequence state")
        self.n_past = n_past

    def restore(self, ctx: lc.llama_context_p, memory: lc.llama_memory_t, n_past: int) -> int:
        """Clear the sequence and load the copy if it lies within ``n_past``; return the length it restored."""
        lc.llama_memory_seq_rm(memory, 0, -1, -1)  # removing a whole sequence never fails
        if 0 <= self.n_past <= n_past:
            if lc.llama_state_seq_set_data_ext(ctx, self._buf, self._len, 0, 0) == 0:
                raise RollbackUnsupportedError(f"{self.what}: llama.cpp could not restore the checkpoint")
            return self.n_past
        self.n_past = -1
        return 0
