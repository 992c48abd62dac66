"""layerdiff names the first difference between two images: layer, file and field, or config key."""

from __future__ import annotations

import io
import tarfile

from stackforge.publish.layerdiff import entries, first_config_key, first_entry, first_layer


def layer(files: dict[str, tuple[bytes, int, int, int]]) -> io.BytesIO:
    """name → (bytes, mode, uid, mtime)"""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode, uid, mtime) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.mtime = len(data), mode, uid, mtime
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


BASE = {"usr/bin/a": (b"a", 0o755, 0, 100), "usr/lib/b.py": (b"b = 1\n", 0o644, 0, 100)}


def changed(name: str, **kw) -> dict:
    data, mode, uid, mtime = BASE[name]
    out = dict(BASE)
    out[name] = (kw.get("data", data), kw.get("mode", mode), kw.get("uid", uid), kw.get("mtime", mtime))
    return out


def test_the_same_files_in_another_order_are_the_same_layer():
    reordered = dict(reversed(list(BASE.items())))
    assert first_entry(entries(layer(BASE)), entries(layer(reordered))) is None


def test_each_field_is_named_with_both_values():
    for kw, field in (({"data": b"b = 2\n"}, "content"), ({"mode": 0o600}, "mode"), ({"uid": 1000}, "owner"),
                      ({"mtime": 200}, "time")):  # fmt: skip
        diff = first_entry(entries(layer(changed("usr/lib/b.py", **kw))), entries(layer(BASE)))
        assert diff is not None and diff.path == "usr/lib/b.py" and diff.field == field, (kw, diff)
        assert diff.ours != diff.theirs and f"/usr/lib/b.py: {field} differs" in diff.describe()


def test_content_wins_over_time_and_a_missing_file_is_named():
    diff = first_entry(entries(layer(changed("usr/bin/a", data=b"A", mtime=5))), entries(layer(BASE)))
    assert diff is not None and diff.field == "content"
    fewer = {k: v for k, v in BASE.items() if k != "usr/bin/a"}
    diff = first_entry(entries(layer(fewer)), entries(layer(BASE)))
    assert diff is not None and diff.field == "missing" and diff.describe() == "/usr/bin/a: only in the published image"


def test_first_layer_and_first_config_key():
    assert first_layer(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert first_layer(["a", "b"], ["a", "b"]) is None and first_layer(["a"], ["a", "b"]) == 1
    ours = {"config": {"Labels": {"x": "1", "y": "2"}}, "rootfs": {"diff_ids": ["a"]}}
    theirs = {"config": {"Labels": {"x": "1", "y": "3"}}, "rootfs": {"diff_ids": ["b"]}}
    assert first_config_key(ours, theirs) == ("config.Labels.y", "2", "3")
    theirs["config"]["Labels"]["y"] = "2"
    assert first_config_key(ours, theirs) is None  # the diff ids are the layers' to answer for
