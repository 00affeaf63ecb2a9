"""ci/rooms_report.py on a small tree of its own."""
from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

CI = Path(__file__).resolve().parent.parent / "ci"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, CI / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_rooms_report_measures_what_it_says(tmp_path):
    rr = _load("rooms_report")
    _write(tmp_path, {
        "tiering/__init__.py": "",
        # a <-> b at module level is a cycle; b -> c only inside a function is not
        "tiering/a.py": "from typing import Any\nfrom kvtier.tiering import b\n\ndef f(x: Any) -> int:\n    return 1\n",
        "tiering/b.py": "from kvtier.tiering.a import f\n\ndef g():\n    from kvtier.tiering import c\n",
        "tiering/c.py": "from kvtier.tiering.b import g\n",
        "tiering/d.py": """\
            class Base:
                def __init__(self):
                    self._own = 1

            class Mixin:
                def peek(self):
                    return self._theirs + self._own2

            class Whole(Base):
                _cls = 3
                def read(self):
                    if hasattr(self, "x"):
                        pass
                    return self._own + self._cls + self._helper() + self._nowhere

                def _helper(self):
                    return {Action.RETAIN: "device"}
            """,
        "tests/test_x.py": "from kvtier.tiering import a\nimport kvtier.tiering.a\n",   # tests are left out
    })
    doc = rr.report(tmp_path)
    s = doc["summary"]
    assert s["import_cycles"] == 1 and doc["import_cycles"][0]["modules"] == ["kvtier.tiering.a", "kvtier.tiering.b"]
    assert rr.report(tmp_path, lazy=True)["import_cycles"][0]["modules"] == \
        ["kvtier.tiering.a", "kvtier.tiering.b", "kvtier.tiering.c"]
    reads = {(r["class"], r["field"]) for r in doc["cross_class_private_reads"]}
    assert reads == {("Mixin", "_theirs"), ("Mixin", "_own2"), ("Whole", "_nowhere")}
    assert s["any_annotations_core"] == 1 and s["hasattr_getattr_probes"] == 1 and s["action_tier_tables"] == 1
    assert doc["largest_classes"][0]["class"] == "Whole" and doc["largest_classes"][0]["bases"] == ["Base"]
    assert s["files_over_400"] == 0 and doc["files"] == 5
