"""Where rank 0's records go besides RUN_DIR/metrics.jsonl: TensorBoard, MLflow, Weights & Biases.

`logging.report_to` names the sinks; launcher/train/metrics.py writes each record to metrics.jsonl first,
then hands it to each sink (sink.py; open_sinks.py opens those `report_to` names). metrics.jsonl stays the source of truth: a tracker that missed
records gets them at the next start of the run, and a tracker never stops training (docs/training.md,
"Trackers"). remote.py runs a tracker behind a worker thread; attach.py works from outside training.
"""
