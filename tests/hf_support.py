"""Tiny model folders made the way mlx-lm makes them, for the Hugging Face I/O tests.

The model is built with mlx-lm's own classes (mlx_lm.models.llama, qwen2...) and saved with
mlx_lm.utils.save_model / save_config; the tokenizer is a real byte-level BPE
trained here with the `tokenizers` library and saved by transformers'
save_pretrained, as mlx_lm.utils.save does. No download.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx

from reference_train.corpus import offline_corpus

EOS = "<|endoftext|>"

# Llama 3 style: grouped-query attention, Llama 3 RoPE scaling, untied head.
LLAMA3_CONFIG = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "vocab_size": 320, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}
# Tied embeddings, a head_dim that is not hidden_size / heads, another eps and theta.
TIED_CONFIG = {
    "model_type": "llama", "hidden_size": 48, "num_hidden_layers": 2,
    "intermediate_size": 80, "num_attention_heads": 4, "num_key_value_heads": 4,
    "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 300, "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}
# The other families (reference_train/hf_io.py FAMILIES), as their real configs set them.
MISTRAL_CONFIG = {
    "model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 112, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "rms_norm_eps": 1e-5, "vocab_size": 300, "rope_theta": 1000000.0,
    "sliding_window": None, "max_position_embeddings": 256, "tie_word_embeddings": False,
}
QWEN2_CONFIG = {  # biases on q/k/v, tied (Qwen2.5 0.5B-style)
    "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6, "vocab_size": 300, "rope_theta": 1000000.0,
    "max_position_embeddings": 256, "use_sliding_window": False, "sliding_window": 256,
    "max_window_layers": 2, "tie_word_embeddings": True,
}
QWEN3_CONFIG = {  # RMSNorm on q and k heads, head_dim above hidden / heads, untied
    "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
    "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "rms_norm_eps": 1e-6, "vocab_size": 300, "rope_theta": 1000000.0,
    "max_position_embeddings": 256, "attention_bias": False, "tie_word_embeddings": False,
}


def train_tokenizer(vocab_size: int = 300):
    """A byte-level BPE trained on the bundled corpus: a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(offline_corpus(300), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS)


def make_llama_folder(path: Path, config: dict, tokenizer=None, seed: int = 0,
                      shard: bool = False, quantize: bool | dict = False) -> Path:
    """A random model of config's model_type (llama, mistral, qwen2, qwen3...), built
    with mlx-lm's own class and saved by mlx-lm at `path` (one shard per tensor when
    `shard`). `quantize`: True = mlx-lm's 4 bits in groups of 32; a dict = the keyword
    arguments of mlx_lm.utils.quantize_model (group_size, bits, quant_predicate...)."""
    import mlx_lm.utils as mu

    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    model_class, args_class = mu._get_classes(config)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    config = json.loads(json.dumps(config))
    if quantize:
        options = {"group_size": 32, "bits": 4} if quantize is True else quantize
        model, config = mu.quantize_model(model, config, **options)
    if shard:
        whole = mu.make_shards
        mu.make_shards = lambda weights, max_file_size_gb=0: whole(weights, 0)
        try:
            mu.save_model(path, model)
        finally:
            mu.make_shards = whole
    else:
        mu.save_model(path, model)
    mu.save_config(config, path / "config.json")
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def mlx_lm_logits(path: Path, tokens: mx.array) -> mx.array:
    """mlx-lm's own logits for `tokens` from the folder at `path`."""
    from mlx_lm.utils import load_model

    model, _ = load_model(path)
    return model(tokens)

