"""kvtier store check / rebuild on real directories."""
import json
import os

import numpy as np
import pytest

from kvtier.cli.main import main
from kvtier.store import StoreConfig, TieredStore


def _store(root, n=50):
    cfg = StoreConfig(root=root, host_bytes=0, nvme_bytes=64 * 8192, block_bytes=4096,
                      slab_bytes=32 * 8192, io_engine="threads")
    with TieredStore.open(cfg) as st:
        st.put_many([i.to_bytes(16, "little") for i in range(n)],
                    [np.full(4096, i, np.uint8) for i in range(n)])
    return cfg


def test_check_sound_then_damaged_then_rebuild_heals(tmp_path, capsys):
    root = tmp_path / "st"
    cfg = _store(root)
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["healthy"] and doc["index"]["records"] == 50 and doc["agree"] == 50
    # zero the first meta page: check says damaged (exit 1), the headers still hold all 50
    mdb = root / "index" / "data.mdb"
    with open(mdb, "r+b") as f:
        f.write(bytes(4096))
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert not doc["healthy"] and "meta page 0" in doc["index"]["problem"] and doc["headers_only"] == 50
    assert main(["store", "rebuild", str(root), "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["blocks_recovered"] == 50 and os.path.isdir(doc["moved_to"])
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 0
    capsys.readouterr()
    with TieredStore.open(cfg) as st:
        out = np.empty(4096, np.uint8)
        assert st.get((7).to_bytes(16, "little"), out) and (out == 7).all()


def test_not_a_store_and_an_open_store_are_one_line_errors(tmp_path, capsys):
    assert main(["store", "check", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kvtier store check: error:" in err and "not a kvtier store" in err
    root = tmp_path / "st"
    cfg = _store(root, 5)
    with TieredStore.open(cfg):
        assert main(["store", "rebuild", str(root)]) == 2
        err = capsys.readouterr().err
        assert "in use" in err and err.count("\n") == 1


def test_table_output_names_the_verdict(tmp_path, capsys):
    root = tmp_path / "st"
    _store(root, 3)
    assert main(["store", "check", str(root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "healthy" in out and "index records" in out


def test_check_says_how_the_last_store_closed(tmp_path, capsys):
    """A leftover OPEN marker: from this boot (a killed process) the index is trusted;
    from another boot (the machine went down with the store open) check is unhealthy."""
    from kvtier.store import unclean

    root = tmp_path / "st"
    cfg = _store(root, 4)
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["last_close"] == "clean"
    unclean.mark_open(root)                      # what a SIGKILLed store leaves behind
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["last_close"] == "killed" and doc["restart"] is None and doc["healthy"]
    (root / unclean.MARKER).write_text("kvtier open 00000000-gone-boot\n")
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["last_close"] == "machine restarted" and "restarted" in doc["restart"] and not doc["healthy"]
    assert main(["store", "check", str(root), "--no-progress"]) == 1
    assert "next open rebuilds" in capsys.readouterr().out
    with TieredStore.open(cfg) as st:
        out = np.empty(4096, np.uint8)
        assert st.stats().index_rebuilds == 1                     # what check said the open would do
        assert st.get((3).to_bytes(16, "little"), out) and (out == 3).all()
    assert main(["store", "check", str(root), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["last_close"] == "clean"
