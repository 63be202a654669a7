"""Flattening one engine step into the tensors a forward pass needs.

A step's rows (T of them) are laid out as `profiler.mixed` does: prefill
chunks first, then decoding sequences grouped by their query length (1, or
K+1 when verifying drafts). Each row has a token id, a position and a KV slot
(`block_table[pos // block_size] * block_size + pos % block_size`) where its
keys and values are written before attention reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PrefillSegment:
    """One prefill chunk: rows [row, row + q_len), attending over `kv_slots` (context + chunk)."""

    row: int
    q_len: int
    kv_slots: torch.Tensor  # (kv,) long


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """`num_seqs` sequences with `q_len` query rows each, rows [row, row + num_seqs * q_len)."""

    row: int
    num_seqs: int
    q_len: int
    kv_slots: torch.Tensor  # (B, max_kv) long, padded with slot 0
    mask: torch.Tensor | None  # (B, 1, q, max_kv) bool, None when all lengths agree and q == 1


@dataclass(frozen=True, slots=True)
class StepBatch:
    token_ids: torch.Tensor  # (T,) long
    positions: torch.Tensor  # (T,) long
    write_slots: torch.Tensor  # (T,) long
    prefills: tuple[PrefillSegment, ...]
    decodes: tuple[DecodeGroup, ...]
    sample_rows: torch.Tensor  # (m,) long: rows whose logits are needed

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One sequence's share of a step: tokens `ids` at positions start.., over `blocks`."""

    ids: list[int]
    start: int
    blocks: list[int]
    samples: int  # how many of its last rows produce logits (0, 1, or q for a decode)
    is_decode: bool


def block_slots(blocks: list[int], stop: int, block_size: int) -> torch.Tensor:
    """KV slots of positions [0, stop) of a sequence with block table `blocks`, (stop,) long."""
    table = torch.tensor(blocks, dtype=torch.long)[:, None] * block_size
    return (table + torch.arange(block_size)).reshape(-1)[:stop]


def build_batch(specs: list[RowSpec], block_size: int, device: torch.device) -> StepBatch:
    """Tensors of one step; `specs` lists prefill chunks and decodes in any order."""
    prefill = [s for s in specs if not s.is_decode]
    by_q: dict[int, list[RowSpec]] = {}
    for s in specs:
        if s.is_decode:
            by_q.setdefault(len(s.ids), []).append(s)
    ids: list[int] = []
    pos: list[int] = []
    write: list[torch.Tensor] = []
    sample: list[int] = []
    segments: list[PrefillSegment] = []
    groups: list[DecodeGroup] = []

    def add_rows(s: RowSpec) -> torch.Tensor:
        q = len(s.ids)
        row = len(ids)
        ids.extend(s.ids)
        pos.extend(range(s.start, s.start + q))
        slots = block_slots(s.blocks, s.start + q, block_size)
        write.append(slots[s.start :])
        sample.extend(range(row + q - s.samples, row + q))
        return slots

    for s in prefill:
        row = len(ids)
        slots = add_rows(s)
        segments.append(PrefillSegment(row, len(s.ids), slots.to(device)))
    for q, seqs in sorted(by_q.items()):
        row = len(ids)
        kv_lens = [s.start + q for s in seqs]
        max_kv = max(kv_lens)
        table = torch.zeros(len(seqs), max_kv, dtype=torch.long)
        for i, s in enumerate(seqs):
            table[i, : kv_lens[i]] = add_rows(s)
        mask = None
        if q > 1 or min(kv_lens) != max_kv:
            lens = torch.tensor(kv_lens, dtype=torch.long)[:, None, None, None]  # (B,1,1,1)
            key = torch.arange(max_kv)[None, None, None, :]  # (1,1,1,kv)
            query = torch.arange(q)[None, None, :, None]  # (1,1,q,1)
            # Query i of a sequence with kv keys sees keys j <= kv - q + i (bottom-right causal).
            mask = (key <= lens - q + query).to(device)
        groups.append(DecodeGroup(row, len(seqs), q, table.to(device), mask))

    def as_long(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return StepBatch(
        as_long(ids),
        as_long(pos),
        torch.cat(write).to(device),
        tuple(segments),
        tuple(groups),
        as_long(sample),
    )
