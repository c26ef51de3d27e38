"""A tiny Qwen2 model dir and a chat data set, built here (no download), for bench_warm_commands' `swift sft`.

    python bench/tiny_qwen2.py DIR     ->  DIR/qwen2-tiny/ (config, weights, tokenizer), DIR/data.jsonl

Run with the ms-swift venv's python (transformers, tokenizers). 400 samples at batch 1: ~400 quick
steps, so attempt 1 is still training when the bench kills it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2TokenizerFast

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]   # what ms-swift's `qwen` template writes
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    texts = [f"what is {i} plus {i}? {2 * i}." for i in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    t = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                           unk_token=None, bos_token=None)
    t.chat_template = CHAT_TEMPLATE
    model_dir = root / "qwen2-tiny"
    t.save_pretrained(model_dir)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(t), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id)
    Qwen2ForCausalLM(cfg).save_pretrained(model_dir)
    with open(root / "data.jsonl", "w") as f:
        for i in range(400):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i} plus {i}?"},
                                             {"role": "assistant", "content": f"{2 * i}."}]}) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
