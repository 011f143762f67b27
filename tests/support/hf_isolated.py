"""Load exports with transformers alone: `python -I tests/support/hf_isolated.py TEXTS_JSON OUT_DIR EXPORT...`.

The project is installed in editable mode, so `-I` alone does not hide it: a meta-path finder
placed first refuses every import of roformer / launcher / data_pipeline, and the script checks at
the end that none of them was loaded. For export i it writes the tokenizer's ids and the MLM logits to
OUT_DIR/hf_out_<i>.safetensors and prints one JSON line, for the test to compare with our model.
"""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT_PACKAGES = {"roformer", "launcher", "data_pipeline", "tests"}


class _BlockProjectCode:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in PROJECT_PACKAGES:
            raise ImportError(f"project code is blocked in this process: {fullname}")
        return None


sys.meta_path.insert(0, _BlockProjectCode())
sys.path = [p for p in sys.path if p and os.path.abspath(p) not in (REPO_ROOT, os.path.join(REPO_ROOT, "tests"), os.path.join(REPO_ROOT, "tests", "support"))]

import json  # noqa: E402

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
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)
    if loaded:
        raise SystemExit(f"project modules were imported: {loaded}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
