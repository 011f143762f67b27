"""A saved fine-tuned model in plain transformers: `python -I tests/support/hf_pipeline_isolated.py MODEL_DIR INPUTS_JSON OUT_JSON`.

The project's packages are blocked (tests/support/isolation_guard.py). INPUTS_JSON is a list of
texts or of {"text": a, "text_pair": b}; `pipeline("text-classification", model=MODEL_DIR)` scores
them and OUT_JSON gets {"config": config.json's id2label / label2id / problem_type / num_labels,
"outputs": the pipeline's top answer per input}.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # isolation_guard takes it off again
import isolation_guard  # noqa: E402  (from here on the project's packages are blocked)

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
    isolation_guard.check_none_loaded()
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
