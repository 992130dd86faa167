"""How vLLM V1 lays out the KV cache: groups of layers, pages, and what one sequence takes.

Read from vLLM's ``vllm/v1/core/kv_cache_utils.py`` (v0.10–v0.11; the grouping dates from
the hybrid allocator of v0.9.2):

* Every attention layer has a *page*: one block of ``block_size`` tokens of that layer on
  one GPU. Standard attention: ``block_size × 2 × KV heads per GPU × head_dim × bytes``.
  MLA (DeepSeek, Kimi) stores one latent of ``kv_lora_rank + qk_rope_head_dim`` elements
  per token and layer, the same on every TP rank (not split), in blocks of 64 tokens on
  Hopper (FlashMLA).
* A model with one kind of attention is one *KV-cache group*: ``num_blocks = available //
  (page × layers per GPU)``; vLLM logs ``num_blocks × block_size`` as "GPU KV cache size".
* A hybrid model (sliding window beside full attention: Gemma 2/3, gpt-oss, Cohere 2) is
  split into groups of the same number of layers, ``group_size`` = the smaller layer count
  of the two kinds (the larger when it is under 1.5 × the smaller), each kind padded to a
  multiple. The blocks are shared by all groups: ``num_blocks = available // (page ×
  group_size)``, and vLLM logs ``num_blocks // groups × block_size`` tokens. A sequence
  needs ``ceil(len / block)`` blocks in each full-attention group and
  ``ceil(min(window − 1 + max_num_batched_tokens, len) / block) + 1`` in each sliding one,
  so the concurrency vLLM reports ("Maximum concurrency") is ``num_blocks`` over their sum.
* Pipeline parallelism splits each group's layers over the stages.

``--disable-hybrid-kv-cache-manager`` (and LMDeploy, which has no such allocator) keeps every
layer at full length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["KVLayout", "hybrid_groups", "mla_block_size"]

_PRE_HOPPER = ("a100", "a10", "l40", "l4", "4090", "3090", "v100", "t4", "a6000")


@dataclass(frozen=True)
class KVLayout:
    """One GPU's KV cache: ``windows`` has one entry per group (0 = full attention, else the
    window in tokens); ``group_size`` layers of ``layer_token_bytes`` per token in each."""

    block_size: int
    layer_token_bytes: int
    group_size: int
    windows: tuple[int, ...]

    @property
    def page_bytes(self) -> int:
        return self.block_size * self.layer_token_bytes

    @property
    def token_bytes(self) -> int:
        """Bytes one token takes across all groups (all layers for a one-group model)."""
        return self.layer_token_bytes * self.group_size * len(self.windows)

    def num_blocks(self, available: int) -> int:
        return max(0, available // (self.page_bytes * self.group_size))

    def tokens(self, blocks: int) -> int:
        """vLLM's "GPU KV cache size": the blocks one group gets, in tokens."""
        return blocks // len(self.windows) * self.block_size

    def blocks_per_seq(self, length: int, batched_tokens: int) -> int:
        """Blocks a sequence of ``length`` tokens holds at most, over all groups."""
        total = 0
        for window in self.windows:
            if window:
                total += math.ceil(min(window - 1 + batched_tokens, length) / self.block_size) + 1
            else:
                total += math.ceil(length / self.block_size)
        return total


def hybrid_groups(full: int, sliding: int, window: int, pp: int) -> tuple[int, tuple[int, ...]]:
    """(layers per group on one GPU, the groups' windows) for ``full`` + ``sliding`` layers."""
    kinds = [(n, w) for n, w in ((full, 0), (sliding, window)) if n > 0]
    low, high = min(n for n, _ in kinds), max(n for n, _ in kinds)
    size = high if high < low * 1.5 else low
    windows = tuple(w for n, w in kinds for _ in range(math.ceil(n / size)))
    return math.ceil(size / pp), windows


def mla_block_size(block_size: int, gpu: str) -> int:
    """vLLM raises the block size to 64 for FlashMLA (Hopper and later); older GPUs keep it."""
    if block_size != 16 or any(name in gpu.lower() for name in _PRE_HOPPER):
        return block_size
    return 64
