"""Where rank 0's records go besides RUN_DIR/metrics.jsonl: TensorBoard, MLflow, Weights & Biases.

`logging.report_to` (`roformer pretrain --report-to`) names the sinks; launcher/train/metrics.py writes every
record to metrics.jsonl first, then hands the same dict to each sink (launcher/tracking/sink.py). metrics.jsonl
stays the source of truth: a tracker that missed records (a server down, a kill) gets them from it at the
next start of the same run, and a tracker never stops training (docs/training.md, "Trackers").

    sink.py         the Sink interface and open_sinks (report_to -> sinks)
    tensorboard.py  TensorBoard (the default)
    remote.py       a tracker behind a worker thread: its run id and sent-ledger in RUN_DIR/tracking/
    translate.py    records -> metrics / tags of a tracker, the run config as flat parameters
    mlflow_backend.py, wandb_backend.py   the two trackers (optional extra: pip install .[track])
    attach.py       files and catch-up from outside training (roformer report, export, finetune)
"""
from launcher.tracking.sink import KNOWN_SINKS, Sink, open_sinks, parse_report_to  # noqa: F401
