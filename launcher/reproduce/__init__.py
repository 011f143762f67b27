"""`roformer reproduce`: the paper's claims at small scale, as ordinary runs plus a report."""
