"""Load exports with transformers alone: `python -I tests/support/hf_isolated.py TEXTS_JSON OUT_DIR EXPORT...`.

The project's packages are blocked (tests/support/isolation_guard.py). For export i it writes the
tokenizer's ids and the MLM logits to OUT_DIR/hf_out_<i>.safetensors and prints one JSON line, for the
test to compare with our model.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # isolation_guard takes it off again
import isolation_guard  # noqa: E402  (from here on the project's packages are blocked)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForMaskedLM, AutoTokenizer  # noqa: E402


def main(texts_json: str, out_dir: str, export_dirs: list) -> None:
    texts = json.loads(open(texts_json, encoding="utf-8").read())
    for i, export_dir in enumerate(export_dirs):
        tokenizer = AutoTokenizer.from_pretrained(export_dir)
        model = AutoModelForMaskedLM.from_pretrained(export_dir).eval()  # RoFormer, or BERT (learned runs)
        batch = tokenizer(texts, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        save_file({"input_ids": batch["input_ids"].contiguous(), "attention_mask": batch["attention_mask"].contiguous(),
                   "logits": logits.contiguous()}, os.path.join(out_dir, f"hf_out_{i}.safetensors"))
        print(json.dumps({"export": export_dir, "tokenizer_class": type(tokenizer).__name__,
                          "model_class": type(model).__name__, "pad_token_id": tokenizer.pad_token_id,
                          "mask_token_id": tokenizer.mask_token_id}))
    isolation_guard.check_none_loaded()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
