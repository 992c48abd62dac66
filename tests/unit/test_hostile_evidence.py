"""A build's evidence as a publish reads it into its record: a result that is a FIFO, a link out of the build, a
device, too deep or of the wrong shape is one error naming the file, never a hang, a traceback or a file from
elsewhere in the record."""

from __future__ import annotations

import pytest

from stackforge.builder.records import evidence
from stackforge.errors import UserError
from stackforge.publish import record as records
from tests.fixtures import hostile_files as hf


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "link_out", "deep_json", "not_utf8"])
@pytest.mark.parametrize("where", ["smoke/chat/smoke.json", "tests/unit/result.json"])
def test_a_result_that_is_not_a_file_of_json_is_one_error(tmp_path, maker, where):
    build = tmp_path / "20260929-101500-1"
    path = hf.SPECIALS[maker](build / where)
    read = records.smoke_results if where.startswith("smoke") else records.test_results
    with pytest.raises(UserError) as err:
        hf.within(10, read, build)
    assert str(path) in err.value.render() and "Traceback" not in err.value.render()


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "link_out"])
def test_gate_lines_that_are_not_a_file_of_text_are_refused(tmp_path, maker):
    path = hf.SPECIALS[maker](tmp_path / "gate.txt")
    with pytest.raises(UserError):
        hf.within(10, records._lines, path)
    assert records._lines(tmp_path / "abi.txt") == []  # none written: none carried


@pytest.mark.parametrize("maker", ["fifo", "zero_link", "deep_json"])
def test_a_build_result_that_is_not_one_is_no_result(tmp_path, maker):
    hf.SPECIALS[maker](tmp_path / evidence.RESULT)
    assert hf.within(10, evidence.read_result, tmp_path) is None
