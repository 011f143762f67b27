"""A saved retrieval model in plain sentence-transformers: `python -I tests/support/st_isolated.py MODEL_DIR INPUTS_JSON OUT_JSON`.

The project's packages are blocked (tests/support/isolation_guard.py). INPUTS_JSON holds one split
as sentence-transformers' InformationRetrievalEvaluator takes it: {"queries": {qid: text}, "corpus":
{cid: text}, "relevant": {qid: [cid, ...]}, "batch_size": n}; OUT_JSON gets the evaluator's metrics
of `SentenceTransformer(MODEL_DIR)` with its own settings (max_seq_length, pooling), and the model's
max_seq_length and module types.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # isolation_guard takes it off again
import isolation_guard  # noqa: E402  (from here on the project's packages are blocked)

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
    isolation_guard.check_none_loaded()
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump({"metrics": metrics, "max_seq_length": model.max_seq_length,
                   "modules": [type(module).__name__ for module in model],
                   "pooling": model[1].get_config_dict()}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
