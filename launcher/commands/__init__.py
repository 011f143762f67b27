"""One module per `roformer` subcommand: `configure(parser)` and `run(args) -> int` (launcher/cli.py)."""
