"""A saved retrieval model in plain sentence-transformers: `python -I tests/support/st_isolated.py MODEL_DIR INPUTS_JSON OUT_JSON`.

The project's packages are blocked from import by tests/support/hf_isolated.py's guard (loaded by
path: a meta-path finder placed first; the script checks at the end that none was loaded). INPUTS_JSON holds one split
as sentence-transformers' InformationRetrievalEvaluator takes it: {"queries": {qid: text}, "corpus":
{cid: text}, "relevant": {qid: [cid, ...]}, "batch_size": n}; OUT_JSON gets the evaluator's metrics
of `SentenceTransformer(MODEL_DIR)` with its own settings (max_seq_length, pooling), and the model's
max_seq_length and module types.
"""
import importlib.util
import os
import sys

# hf_isolated.py blocks the project's packages when it is loaded (its module level): the same guard here.
_GUARD = importlib.util.spec_from_file_location("hf_isolated", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                            "hf_isolated.py"))
_guard = importlib.util.module_from_spec(_GUARD)
_GUARD.loader.exec_module(_guard)
PROJECT_PACKAGES = _guard.PROJECT_PACKAGES

import json  # noqa: E402

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator  # noqa: E402


def main(model_dir: str, inputs_json: str, out_json: str) -> None:
    inputs = json.loads(open(inputs_json, encoding="utf-8").read())
    model = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    evaluator = InformationRetrievalEvaluator(
        inputs["queries"], inputs["corpus"], {q: set(c) for q, c in inputs["relevant"].items()},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1, 10], precision_recall_at_k=[1, 10], map_at_k=[100],
        batch_size=inputs["batch_size"], write_csv=False)
    metrics = evaluator(model)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)
    if loaded:
        raise SystemExit(f"project modules were imported: {loaded}")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"metrics": metrics, "max_seq_length": model.max_seq_length,
                   "modules": [type(module).__name__ for module in model],
                   "pooling": model[1].get_config_dict()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
