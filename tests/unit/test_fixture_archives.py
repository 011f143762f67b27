"""The stored run directories (tests/fixtures/*.tar.xz) unpack on every Python 3.11 (tests/support/helpers.py
extract_archive): through Python's "data" filter where it exists (3.11.4 on), and where it does not (Debian 12's
3.11.2), after the same refusal of links and of members outside the target, checked by hand."""
import io
import tarfile

import pytest

from tests.support.helpers import REPO, extract_archive


def _archive(path, members):
    with tarfile.open(path, "w") as archive:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                archive.addfile(info)
            else:
                data = b"text"
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture(params=["data filter", "checked by hand"])
def python_tarfile(request, monkeypatch):
    if request.param == "checked by hand":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return request.param


def test_a_stored_run_unpacks(python_tarfile, tmp_path):
    extract_archive(REPO / "tests" / "fixtures" / "previous_run_dir.tar.xz", tmp_path)
    assert (tmp_path / "prev_run" / "run" / "config.yaml").is_file()


@pytest.mark.parametrize("member", [("../outside.txt", "file"), ("run/link", "symlink")])
def test_links_and_members_outside_the_target_are_refused(python_tarfile, tmp_path, member):
    archive = _archive(tmp_path / "bad.tar", [("run/good.txt", "file"), member])
    with pytest.raises(tarfile.TarError):
        extract_archive(archive, tmp_path / "out")
    assert not (tmp_path / "outside.txt").exists()
