"""The run as resolved, read by every step after parsing: the init_from directory as read (init_from.py), the stages
at a world size with `micro_batch_size: auto` sized (run_stages.py stages_at), every stage's DeepSpeed config and the
shape they train in (run_setup.py RunSetup) and what one rank starts from (rank_setup.py RankSetup). `roformer plan`,
the launch plan and every rank resolve through here, once each; launcher.config below only parses, and the checks
of the data (launcher.inputs) and the steps after (checkpoint resume, engine, trainer) read what is resolved here.
"""
