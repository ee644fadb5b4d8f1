"""The tiny TRL setup shared by tests/test_trainers.py and tests/engines/trl_runs.py: a one-layer
Llama and a WordLevel tokenizer built here (no hub, no downloads), a reward that varies within a
group, and a GRPOConfig with small defaults (8 rows per device, GA 2, 4 generations, 8 tokens)."""

from __future__ import annotations

import gc

from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig

WORDS = ["[PAD]", "[EOS]", *"abcdefgh"]
MAX_LEN = 8


def tiny_tokenizer():
    tk = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="a"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", eos_token="[EOS]")


def tiny_model():
    import torch

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, pad_token_id=0, eos_token_id=1,
                      bos_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


def reward_words(completions, **kwargs):
    """More words, more reward; the letter 'a' costs one: rewards vary within a group."""
    return [len(c.split()) - 2.0 * c.count("a") for c in completions]


def config(**kw):
    # Trainer.train ends with accelerate's free_memory, a full gc.collect: with torch, TRL and
    # verl imported it walks ~500k objects, ~0.7 s of a ~0.8 s run. gc.freeze moves the objects
    # alive now out of the collector's sight, so each run's collect walks only what it made.
    gc.freeze()
    base = dict(output_dir="/tmp/rlgates-trl-test", per_device_train_batch_size=8,
                gradient_accumulation_steps=2, steps_per_generation=2, num_generations=4,
                max_completion_length=MAX_LEN, num_iterations=2, max_steps=2,
                learning_rate=5e-2, logging_steps=1, report_to="none", use_cpu=True,
                save_strategy="no", seed=0, disable_tqdm=True,
                bf16=False,  # TRL turns bf16 autocast on by default, on the CPU too
                generation_kwargs={"sequence_bias": {(1,): 1.0}})  # end token: ragged lengths
    base.update(kw)
    return GRPOConfig(**base)


DATA = Dataset.from_dict({"prompt": ["a b c", "d e f", "g h a", "b b c"] * 4})
