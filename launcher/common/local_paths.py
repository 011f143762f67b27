"""A URL where a local path is meant: the one pure check of a path's form, shared by the run config's parse
(launcher/config/run_config.py, which reaches neither the output gate nor the run directory) and every command's
output paths (launcher/outputs/output_paths.py). Reads nothing on disk."""
from __future__ import annotations

import re

from launcher.common.errors import UserError

# "s3://b/d" reaches us as Path("s3:/b/d") from argparse's type=Path; a one-letter scheme is a drive letter.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


def refuse_url(flag: str, value) -> None:
    """A URL where a local path is meant would silently become a local `./s3:/...` path. Object storage is
    read and written only as prepared data (data.data_dir, `data prepare --out`, `data upload`), which do
    not call this."""
    if value is not None and _URL.match(str(value)):
        scheme, rest = str(value).split(":/", 1)
        raise UserError(f"{flag} {scheme}://{rest.lstrip('/')}: a {scheme}:// URL, but a local path is expected "
                        f"(only prepared data may live in object storage, as s3://BUCKET/PREFIX: data.data_dir, "
                        f"`data prepare --out`, `data upload`; give a local or mounted path here)")
