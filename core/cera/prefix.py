"""Saved sequence states keyed by the tokens that made them, so a prompt that extends a saved
prefix prefills only its tail.

A `Snapshot` is what a backend needs to resume after `tokens`: each attention layer's K and V
rows 0..n-1 and each conv layer's state (arrays named "k.{layer}", "v.{layer}", "conv.{layer}").
`PrefixCache` keeps them in memory, least recently used first out past a byte budget, and,
given a directory, on disk too (one .npz per snapshot, under a folder named for the model file
and backend, so two models or backends never share entries).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Snapshot:
    tokens: tuple[int, ...]
    arrays: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _key(tokens) -> str:
    return hashlib.sha256(np.asarray(tokens, np.uint32).tobytes()).hexdigest()[:32]


class PrefixCache:
    """Snapshots by token prefix: `lookup(ids)` finds the longest saved strict prefix of ids."""

    def __init__(self, budget_bytes: int, directory: str | Path | None = None, namespace: str = ""):
        self.budget = budget_bytes
        self._memory: OrderedDict[tuple[int, ...], Snapshot] = OrderedDict()   # least recently used first
        self._disk: dict[tuple[int, ...], Path] = {}                            # tokens -> .npz
        self._dir = Path(directory) / namespace if directory is not None else None
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
            for path in self._dir.glob("*.npz"):
                with np.load(path) as data:
                    self._disk[tuple(int(t) for t in data["tokens"])] = path

    @classmethod
    def for_model(cls, path: str | Path, backend: str, budget_mb: int, directory: str | Path | None = None):
        """A cache for the model file at `path` run by `backend`: on disk under a folder named
        for the file (name and size) and backend."""
        path = Path(path)
        return cls(budget_mb << 20, directory, f"{path.name}-{path.stat().st_size}-{backend}")

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._memory.values())

    def __len__(self) -> int:
        return len(self._memory)

    def store(self, snapshot: Snapshot) -> None:
        if snapshot.nbytes > self.budget:
            return
        self._memory[snapshot.tokens] = snapshot
        self._memory.move_to_end(snapshot.tokens)
        while self.nbytes > self.budget:
            self._memory.popitem(last=False)
        if self._dir is not None and snapshot.tokens not in self._disk:
            path = self._dir / f"{_key(snapshot.tokens)}.npz"
            np.savez(path, tokens=np.asarray(snapshot.tokens, np.uint32), **snapshot.arrays)
            self._disk[snapshot.tokens] = path

    def lookup(self, ids: list[int]) -> Snapshot | None:
        """The snapshot of the longest saved prefix of `ids` shorter than ids (at least one token
        must remain to run: a state can only be resumed, never re-entered at its own end)."""
        ids = tuple(ids)
        saved = [t for t in (*self._memory, *self._disk) if len(t) < len(ids) and ids[:len(t)] == t]
        if not saved:
            return None
        tokens = max(saved, key=len)
        if tokens in self._memory:
            self._memory.move_to_end(tokens)
            return self._memory[tokens]
        with np.load(self._disk[tokens]) as data:
            snapshot = Snapshot(tokens, {k: data[k] for k in data.files if k != "tokens"})
        self.store(snapshot)
        return snapshot
