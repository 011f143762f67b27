"""What a person looks at: RUN_DIR/plots/ (rendered at every stage end and at the end of a run) and
`roformer report RUN_DIR` (a one-page report.md beside the same PNGs).

Reads only what a run directory holds (metrics.jsonl, stages.json, config.yaml, sidecars, eval JSON
reports), so it works on a running, stopped or copied run. Imports neither torch nor DeepSpeed;
matplotlib (Agg backend) is imported only when rendering. Training reaches it through
launcher.report.hook, which runs the rendering as a separate, detached process.
"""
