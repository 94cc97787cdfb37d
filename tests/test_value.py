"""The value types' shared methods (``value.Value``) on the values a real tree gives.

Every verdict, record and problem is a ``Value``: its equality, hash, ``repr`` and ``_replace``
replace what a dataclass generated (docs/plugin.md, "Cost"). A wrong ``__eq__`` or a
``_replace`` that accepts a misspelt field would not show in any verdict test: the verdict of
the racy tree and the record of a patched one are compared, copied and printed here instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trees import TreeFactory

from sglang_dsv4_fix import verdict
from sglang_dsv4_fix.errors import Exit
from sglang_dsv4_fix.main import main
from sglang_dsv4_fix.provenance import Provenance, read
from sglang_dsv4_fix.tree import find_tree

KERNEL = "sglang/jit_kernel/csrc/deepseek_v4/c_plan.cuh"


@pytest.fixture
def racy(tree_factory: TreeFactory, tmp_path: Path) -> verdict.Verdict:
    """The verdict on a real, unpatched 0.5.16 tree (racy, one problem with its fix)."""
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    v = verdict.assess(find_tree(root), verdict.Options(tree="/sp"))
    assert v.state == "racy"
    return v


def test_a_copy_equals_its_original_and_one_changed_field_does_not(racy: verdict.Verdict) -> None:
    copy = racy._replace()
    assert copy == racy and copy is not racy
    changed = racy._replace(headline=racy.headline + "!")
    assert changed != racy
    assert (changed.headline, racy.headline) == (racy.headline + "!", copy.headline)
    assert changed._asdict() == {**racy._asdict(), "headline": racy.headline + "!"}


def test_a_value_never_equals_another_type_with_the_same_fields(racy: verdict.Verdict) -> None:
    (problem,) = racy.problems
    assert problem.__eq__(problem._asdict()) is NotImplemented
    assert problem != problem._asdict() and problem != tuple(problem._asdict().values())


def test_equal_values_hash_alike_and_different_ones_apart(racy: verdict.Verdict) -> None:
    """Values are dict keys and set members: equal ones hash equal, the racy verdict and its
    copies collapse to one, a changed one stays apart."""
    changed = racy._replace(exit=Exit.OK)
    assert hash(racy._replace()) == hash(racy)
    assert hash(changed) != hash(racy)
    assert len({racy, racy._replace(), changed}) == 2


def test_repr_names_the_type_and_every_field_in_order(racy: verdict.Verdict) -> None:
    (problem,) = racy.problems
    assert repr(problem) == (
        "Problem(fix='sglang-dsv4-fix apply --tree /sp', kind='racy', "
        "message='the racy init of warp_max/warp_min')"
    )


def test_replace_refuses_fields_the_type_does_not_have(racy: verdict.Verdict) -> None:
    """A misspelt field in ``_replace`` is a TypeError naming the type and every unknown field
    (sorted), as NamedTuple's was; never silently a value without the change."""
    with pytest.raises(TypeError) as e:
        racy._replace(stat="verified", headlines="x", exit=Exit.OK)
    assert str(e.value) == "Verdict has no field headlines, stat"
    with pytest.raises(TypeError) as e:
        racy.problems[0]._replace(fixed="x")
    assert str(e.value) == "Problem has no field fixed"


def test_a_records_replace_keeps_its_type_and_every_other_field(
    tree_factory: TreeFactory, tmp_path: Path
) -> None:
    root = tree_factory.installed("0.5.16", tmp_path / "sp")
    assert main(["apply", "--tree", str(root), "--no-clear-cache"]) == 0
    record = read(root / KERNEL)
    assert record is not None and record.state == "applied"
    pending = record._replace(state="pending")
    assert type(pending) is Provenance
    assert pending._asdict() == {**record._asdict(), "state": "pending"}
    assert record.state == "applied"  # the original is untouched
