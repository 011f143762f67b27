"""`roformer pretrain` on the launching machine: hostfile and filters, the launch plan, each node's
command, forwarded environment, pre-flight checks over ssh, supervision of DeepSpeed's runner, and the
rank guard every rank runs under. Starts launcher.train.rank_entry as a process, never imports it."""
