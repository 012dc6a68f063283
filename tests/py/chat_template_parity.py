"""The reference for tests/data.rs: transformers' tokenizer and apply_chat_template.

Reads {"dir": MODEL_DIR, "conversations": [[{"role", "content"}, ...], ...]} on stdin and
prints {"prompts": [{"text": ..., "ids": [...]}, ...]}, the rendered prompt (with the generation
prompt) and its ids as transformers gives them.
"""
import json
import sys

from transformers import AutoTokenizer

request = json.load(sys.stdin)
tokenizer = AutoTokenizer.from_pretrained(request["dir"])
prompts = []
for messages in request["conversations"]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    prompts.append({"text": text, "ids": list(ids)})
json.dump({"prompts": prompts}, sys.stdout, ensure_ascii=False)
