"""Named model sizes: ``preset("bam-120m", prior="alibi")`` -> a :class:`GPTConfig`.

Each preset is plain data: ``GPTConfig`` keyword arguments (:data:`PRESETS`), and the options it
gives a prior the config uses where the spec leaves them out (:data:`PRIOR_DEFAULTS`: the tiny
model's GOAT has 3 frequencies, whether its spec is ``"goat"`` or ``"alibi+goat"``). The paper sizes
come from the seeds' tables; where a table leaves a choice open, the mapping chosen is written next
to it:

``goat-c4-125m`` (seed 000 App. G, Table 1: GPT-2 tokenizer, L_train 2048, 12 layers, 12 heads,
d_model 768, pre-norm, "Goat d_pos = 12 (Pos Rank 2, Abs Rank 8), Key Bias enabled"):

- d_pos = 12 is read with Section 4's own formula, ``d_p = 2R + 2`` lanes of each 64-wide head:
  R = 5 frequencies (10 lanes), the key bias (sink ``u(j)``, 1 lane), and the lane Algorithm 1
  pads with zero, which here carries GOAT's key-linear slope (App. F.3), starting at 0, so the
  prior starts as standard attention either way. Content keeps ``64 - 12 = 52`` lanes, as
  ``d_c = d_h - d_p``. ``prior="goat(slope=none)"`` gives the literal zero lane (the library builds no
  padding lanes, so content then keeps 53). "Pos Rank 2, Abs Rank 8" has no counterpart in this
  GOAT; ``2 x 2 + 8 = 12`` suggests 2 frequencies plus 8 absolute lanes, but the paper defines no
  rank-8 absolute term, so it is not guessed at. The sink MLP keeps its 8 sinusoidal inputs.
- The table gives no MLP or norm: this library's block (RMSNorm, SwiGLU of width 8/3 d = 2048,
  as many weights as GPT-2's 4d GELU MLP), tied embeddings as GPT-2, the unpadded GPT-2 vocabulary
  50257. That makes 121M parameters (table: "approximately 125M").

``bam-120m``, ``bam-432m``, ``bam-1.1b`` (seed 003 App. C, Table 1; Llama 3 style, Mistral v0.3
tokenizer of 32768 tokens, contexts 512 / 1024 / 2048, 512 by default here):

- heads, layers, hidden size from the table; "ff hidden size" (2x, 2x, 4x the hidden size) is
  the SwiGLU width. Embeddings are untied: only then do the table's counts come out (120M:
  embedding 32768 x 768 = 25M, transformer 12 blocks x 5.9M + a 25M head = 96M, "~95M").
  Heads are not grouped (the counts leave no room for fewer key/value heads).
- BAM: a GGD prior per layer (3 x heads x layers = 576 / 1008 / 1440 parameters, as the table),
  started uniform and training alpha and beta only (App. F.1-F.2, the paper's best).
"""

from __future__ import annotations

from dataclasses import fields

from ..priors import with_defaults
from .gpt import GPTConfig

# What the three BAM sizes share (seed 003 App. C): the tokenizer, the context, untied embeddings,
# and the GGD prior started uniform, training alpha and beta (GGD's default trainable).
_BAM = dict(vocab_size=32768, seq_len=512, tie_embeddings=False, prior="ggd", prior_init="uniform")

#: The model sizes by name (``preset(name)``, ``train --preset``): ``GPTConfig`` fields each, the
#: papers' configurations as data.
PRESETS: dict[str, dict] = {
    # Byte-level, trains in minutes on 2 CPU cores. GOAT's 3 frequencies fold into 8 of 32 lanes.
    "tiny": dict(vocab_size=256, seq_len=256, d_model=128, n_layers=4, n_heads=4),
    # Byte-level, ~11M parameters; 64-wide heads, GOAT as in the C4 run (12 of 64 lanes).
    "small": dict(vocab_size=256, seq_len=512, d_model=384, n_layers=6, n_heads=6),
    "goat-c4-125m": dict(
        vocab_size=50257,
        seq_len=2048,
        d_model=768,
        n_layers=12,
        n_heads=12,
        mlp_hidden=2048,
        tie_embeddings=True,
        prior="goat",
    ),
    "bam-120m": dict(_BAM, d_model=768, n_layers=12, n_heads=16, mlp_hidden=2 * 768),
    "bam-432m": dict(_BAM, d_model=1536, n_layers=14, n_heads=24, mlp_hidden=2 * 1536),
    "bam-1.1b": dict(_BAM, d_model=2048, n_layers=15, n_heads=32, mlp_hidden=4 * 2048),
}

#: Preset -> prior -> options: set on that prior wherever a config of the preset uses it and its
#: spec leaves them out.
PRIOR_DEFAULTS: dict[str, dict[str, dict]] = {
    "tiny": dict(goat=dict(num_freqs=3)),  # 3 frequencies fold into 8 of 32 lanes
    "small": dict(goat=dict(num_freqs=5)),
    "goat-c4-125m": dict(goat=dict(num_freqs=5, sink_freqs=8)),
}


def preset(name: str, **overrides) -> GPTConfig:
    """The config of preset ``name``, with any field replaced: ``preset("tiny", prior="goat")``;
    its prior takes the preset's :data:`PRIOR_DEFAULTS` that its spec does not set."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    unknown = set(overrides) - {f.name for f in fields(GPTConfig)}
    if unknown:
        raise ValueError(f"overrides name unknown GPTConfig fields {sorted(unknown)}")
    config = {**PRESETS[name], **overrides}
    if name in PRIOR_DEFAULTS:
        config["prior"] = with_defaults(config.get("prior", "uniform"), **PRIOR_DEFAULTS[name])
    return GPTConfig(**config)
