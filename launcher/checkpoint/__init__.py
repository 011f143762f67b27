"""A run's checkpoints, the whole lifecycle in one place; no other package calls DeepSpeed's
save_checkpoint / load_checkpoint or scans checkpoints/:

    catalogue.py     what is on disk: the sidecar, the catalogue (scan, verify, newest intact, what
                     retention drops), the guard's rewind point, file records, setting a damaged one aside
    checkpointer.py  all ranks together: save (the sidecar last), load, pruning with protected steps,
                     RNG state, the loss scale the sidecar records
    resume.py        where a start comes from (ResumePlan: which checkpoint, through which conversion,
                     what is recorded), and the branch point of `branch_from`
    universal.py     DeepSpeed's universal checkpoint, made loadable by every ZeRO stage
    weights.py       read-only views for export, averaging and evaluation: consolidated fp32 weights

Above launcher.run_dir (paths, the lock, record files), below launcher.train (checked by import-linter).
catalogue.py and weights.py import no torch at module level: the report, the launching machine and
`roformer export --help` use them without it.
"""
