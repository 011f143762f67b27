"""A saved fine-tuned model in plain transformers: `python -I tests/support/hf_pipeline_isolated.py MODEL_DIR INPUTS_JSON OUT_JSON`.

The project's packages are blocked from import as in tests/support/hf_isolated.py (a meta-path
finder placed first; the script checks at the end that none was loaded). INPUTS_JSON is a list of
texts or of {"text": a, "text_pair": b}; `pipeline("text-classification", model=MODEL_DIR)` scores
them and OUT_JSON gets {"config": config.json's id2label / label2id / problem_type / num_labels,
"outputs": the pipeline's top answer per input}.
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

from transformers import pipeline  # noqa: E402


def main(model_dir: str, inputs_json: str, out_json: str) -> None:
    inputs = json.loads(open(inputs_json, encoding="utf-8").read())
    classify = pipeline("text-classification", model=model_dir, device="cpu")
    outputs = [classify(item) for item in inputs]  # one by one: no padding in the way of the comparison
    outputs = [out[0] if isinstance(out, list) else out for out in outputs]
    config = classify.model.config
    result = {"config": {"id2label": {str(k): v for k, v in config.id2label.items()}, "label2id": dict(config.label2id),
                         "problem_type": config.problem_type, "num_labels": config.num_labels,
                         "model_class": type(classify.model).__name__},
              "outputs": outputs}
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)
    if loaded:
        raise SystemExit(f"project modules were imported: {loaded}")
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
