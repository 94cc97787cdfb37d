"""Batches the harness plans: extend lengths written ``4x72+3x24`` (72 rows of 4, then 24 of 3),
optionally ``@P`` for P tokens already cached per row (``seq_len = P + extend_len``).

Defaults from FACTS.md: the uniform control, the seed's ragged batches (B300), a partial warp, the
warp/block boundaries (a ragged row at 31/32/33/63/64/65) and the full-block shapes that reproduce
on the H200 ([4]x1023+[3] and friends); then serving-like batches: the largest batch uniform and
with mixed decode lengths (1..4 tokens a row, as MTP verify rows are), and cached prefixes of 1,
63, 64 and 1000 tokens before the extend, as a prefill with radix-cache hits has. Each for c4 and c128.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_dsv4_fix.errors import Exit, FatalError

MAX_BATCH = 1024  # kMaxPrefillBatchSize: kernel0 runs as one block of 1024 threads
SWA_PAGE_SIZE = 256
RING_SIZE = 128
MAX_MTP_DRAFT_TOKENS = 4  # kMaxMTPDraftTokens in plan_compress_prefill (all affected releases)

BASE_SHAPES = (
    "4x96",
    "4x72+3x24",
    "3x104+2x24",
    "4x16+3",
    "4x31+3",
    "4x32+3",
    "4x33+3",
    "4x63+3",
    "4x64+3",
    "4x65+3",
    "4x64+3x32",
    "4x255+3",
    "4x512+3x512",
    "4x992+3x32",
    "3x1023+2",
    "4x1023+3",
)
MIXED_DECODE = "1x256+2x256+3x256+4x256"  # the largest batch, 1-4 tokens a row
SERVING_SPECS = ("4x72+3x24", "4x1023+3", MIXED_DECODE)
# cached tokens before the extend (0 is BASE_SHAPES): one, one short of and exactly a multiple
# of 4 and 64, and a long prompt
SERVING_PREFIXES = (1, 63, 64, 1000)
SERVING_SHAPES = (
    "4x1024",
    MIXED_DECODE,
    *(f"{spec}@{p}" for p in SERVING_PREFIXES for spec in SERVING_SPECS),
)
DEFAULT_SHAPES = BASE_SHAPES + SERVING_SHAPES
DEFAULT_RATIOS = (4, 128)
_PART = re.compile(r"^(\d+)(?:x(\d+))?$")
_PREFIX = re.compile(r"^(?P<lens>[^@]*)(?:@(?P<prefix>\d+))?$")


@dataclass(frozen=True)
class Shape:
    spec: str  # the extend lengths as written, e.g. "4x72+3x24"
    extend_lens: tuple[int, ...]
    ratio: int  # compress ratio: 4 (overlapping) or 128
    prefix: int = 0  # tokens already cached per request: seq_len = prefix + extend_len

    @property
    def name(self) -> str:
        return f"c{self.ratio} [{self.text}]"

    @property
    def text(self) -> str:
        """The spec as ``parse`` takes it back: ``4x72+3x24@63``."""
        return self.spec + (f"@{self.prefix}" if self.prefix else "")

    @property
    def batch(self) -> int:
        return len(self.extend_lens)

    @property
    def rows(self) -> int:
        """sum(extend_lens): the ragged row count, the bound every ragged_id must stay under."""
        return sum(self.extend_lens)

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(self.prefix + e for e in self.extend_lens)

    @property
    def uniform(self) -> bool:
        return len(set(self.extend_lens)) == 1

    @property
    def signature(self) -> int:
        """B*s_max-1: the largest ragged_id of the MTP fast path, taken when the race hides s_min."""
        return self.batch * max(self.extend_lens) - 1

    @property
    def mtp_pad(self) -> int:
        return min(RING_SIZE - self.ratio, MAX_MTP_DRAFT_TOKENS)

    @property
    def cpu_path_equivalent(self) -> bool:
        """Whether the CPU planning path must give the same write plan as kernel0.

        kernel0 starts writes at min(last_c_pos - overlap, seq_len - mtp_pad); the CPU loop at
        last_c_pos - overlap. The compress plan is the same either way.
        """
        overlap = self.ratio if self.ratio == 4 else 0
        for sl in self.seq_lens:
            last_c = sl // self.ratio * self.ratio
            if min(last_c - overlap, sl - self.mtp_pad) != last_c - overlap:
                return False
        return True


def parse(spec: str, ratio: int) -> Shape:
    """``"4x72+3x24"`` or ``"4x72+3x24@63"`` -> Shape; FatalError(USAGE) on what kernel0 cannot take."""
    text = spec.replace(" ", "")
    m = _PREFIX.match(text)
    if not m:
        raise FatalError(f"bad shape {spec!r}: write it like 4x72+3x24 or 4x72+3x24@63", Exit.USAGE)
    lens = _lengths(spec, m.group("lens"))
    prefix = int(m.group("prefix") or 0)
    if len(lens) > MAX_BATCH:
        raise FatalError(f"bad shape {spec!r}: batch {len(lens)} > {MAX_BATCH}", Exit.USAGE)
    if ratio not in (4, 128):
        raise FatalError(f"bad compress ratio {ratio}: 4 or 128", Exit.USAGE)
    if sum(lens) > 0xFFFF:
        raise FatalError(f"bad shape {spec!r}: {sum(lens)} tokens > 65535", Exit.USAGE)
    return Shape(m.group("lens"), tuple(lens), ratio, prefix)


def _lengths(spec: str, text: str) -> list[int]:
    lens: list[int] = []
    for part in text.split("+"):
        m = _PART.match(part)
        if not m:
            raise FatalError(f"bad shape {spec!r}: write it like 4x72+3x24", Exit.USAGE)
        lens += [int(m.group(1))] * int(m.group(2) or 1)
    if not lens or min(lens) < 1:
        raise FatalError(f"bad shape {spec!r}: every extend length must be >= 1", Exit.USAGE)
    return lens


def grid(specs: tuple[str, ...], ratios: tuple[int, ...]) -> list[Shape]:
    return [parse(s, r) for r in ratios for s in specs]
