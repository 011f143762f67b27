"""The export format, written and read in one place: a checkpoint (or an average of several) as a transformers
RoFormer directory with its tokenizer, model card, sentence-transformers files and checksums (exporter.py,
`roformer export`), and the checked opening of such a directory for evaluation and fine-tuning
(export_reader.py). Below launcher.downstream, which reads exports; imports no training code.
"""
