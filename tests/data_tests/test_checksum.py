"""The dataset checksum: SHA-256 of exactly the files a load reads, reproducible with sha256sum."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kitune.data.checksum import dataset_checksum, dataset_files, document_hash
from kitune.data.errata import LOCOMO_ERRATA
from kitune.errors import DataError
from kitune.schema import Document


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dataset(root: Path) -> Path:
    root.mkdir()
    (root / "corpus.jsonl").write_text('{"docid": "1", "text": "Acme."}\n', encoding="utf-8")
    (root / "ground_truth.jsonl").write_text(
        '{"query_id": "q", "query": "Q?", "answer": "A"}\n', encoding="utf-8"
    )
    (root / "README.md").write_text("not read by the loaders", encoding="utf-8")
    return root


def test_checksum_is_sha256sum_of_the_files_read(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "d")
    got = dataset_checksum(root)
    corpus, truth = (
        _sha((root / "corpus.jsonl").read_bytes()),
        _sha((root / "ground_truth.jsonl").read_bytes()),
    )
    assert got.files == {"corpus.jsonl": corpus, "ground_truth.jsonl": truth}  # README.md is not read
    # what `sha256sum corpus.jsonl ground_truth.jsonl | sha256sum` prints
    assert got.sha256 == _sha(f"{corpus}  corpus.jsonl\n{truth}  ground_truth.jsonl\n".encode())
    # same bytes elsewhere: same digest; one byte changed: another
    other = _dataset(tmp_path / "elsewhere")
    assert dataset_checksum(other).sha256 == got.sha256
    (other / "ground_truth.jsonl").write_text(
        '{"query_id": "q", "query": "Q?", "answer": "B"}\n', encoding="utf-8"
    )
    assert dataset_checksum(other).sha256 != got.sha256


def test_checksum_covers_the_errata_overlay_and_locomo_files(tmp_path: Path) -> None:
    root = _dataset(tmp_path / "d")
    before = dataset_checksum(root).sha256
    (root / "errata.json").write_text(json.dumps({"q": {"answer": "B"}}), encoding="utf-8")
    after = dataset_checksum(root)
    assert "errata.json" in after.files and after.sha256 != before
    explicit = tmp_path / "fixes.json"
    explicit.write_text("{}", encoding="utf-8")
    names = [f.name for f in dataset_files(root, errata=explicit)]
    assert names == ["corpus.jsonl", "ground_truth.jsonl", "fixes.json"]  # the explicit overlay wins
    sample = {"sample_id": "conv-1", "conversation": {"speaker_a": "A", "speaker_b": "B"}, "qa": []}
    locomo = tmp_path / "locomo10.json"
    locomo.write_text(json.dumps([sample]), encoding="utf-8")
    assert dataset_checksum(locomo).files == {  # LoCoMo questions get the shipped overlay (issue 40)
        "locomo10.json": _sha(locomo.read_bytes()),
        "locomo10.errata.json": _sha(LOCOMO_ERRATA.read_bytes()),
    }
    with pytest.raises(DataError, match="does not exist"):
        dataset_checksum(tmp_path / "missing")


def test_checksum_of_the_shared_fixture_is_stable() -> None:
    fixture = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "fixture").resolve()
    if not fixture.is_dir():
        pytest.skip("shared data not found")
    got = dataset_checksum(fixture)
    assert sorted(got.files) == [
        "corpus.jsonl",
        "ground_truth.jsonl",
        "qrel_evidence.txt",
        "qrel_golds.txt",
        "queries.tsv",
    ]
    listing = "".join(f"{_sha((fixture / n).read_bytes())}  {n}\n" for n in sorted(got.files))
    assert got.sha256 == _sha(listing.encode())


def test_document_hash_is_title_separator_text_and_changes_with_either() -> None:
    doc = Document(docid="d1", title="Acme", text="Acme was founded in 1999.")
    assert document_hash(doc) == _sha(b"Acme\x1fAcme was founded in 1999.")[:32]
    assert document_hash(Document(docid="other", title="Acme", text=doc.text)) == document_hash(doc)
    assert document_hash(Document(docid="d1", title="Acme Corp", text=doc.text)) != document_hash(doc)
    assert document_hash(Document(docid="d1", text="x")) == _sha(b"\x1fx")[:32]
