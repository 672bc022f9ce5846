"""--order file with text ids: the counting pass keeps 8 bytes per distinct id (its key), not a
Python str per id, and counts what the model tells apart (an int and its text are one id)."""

import tracemalloc
import uuid

import pytest

from sketchrec import chunks
from sketchrec.cli import source as source_module
from sketchrec.cli.config import ReplayConfig
from sketchrec.cli.replay import build_parser
from sketchrec.cli.source import open_source
from sketchrec.reader import RatingFile

N_USERS = 40_000


def streamed(path, *extra):
    args = build_parser().parse_args([str(path), "--order", "file", "--model", "sketch", *extra])
    return open_source(ReplayConfig.from_args(args))


@pytest.fixture(scope="module")
def uuid_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ids") / "uuids.csv"
    lines = [f"{uuid.UUID(int=u)},{u % 50},{1 + u % 5},{u}\n" for u in range(N_USERS)]
    path.write_text("user,item,rating,timestamp\n" + "".join(lines))
    return path


def test_mixed_ids_are_counted_as_the_model_tells_them_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 256)   # many blocks: some all-int, some text
    path = tmp_path / "mixed.csv"
    rows = [(u, i) for u in range(1, 40) for i in (1, 2)] + [("5", "x"), ("alice", "x"), ("bob", 2)]
    path.write_text("user,item,rating\n" + "".join(f"{u},{i},3\n" for u, i in rows))
    src = streamed(path)
    users = {str(u) for u, _ in rows}
    items = {str(i) for _, i in rows}
    assert src.capacity == len(users) + len(items) == 41 + 3
    assert src.total == len(rows)


def test_streaming_keeps_a_key_per_id_not_its_text(uuid_file, monkeypatch):
    """Both passes of --order file (counting, then learning block by block) hold 8 bytes per
    distinct id (a few copies while merging) plus a block and a batch. The broken variant (a set
    of the ids' text, and a reader interning across blocks, as before) holds every id's str."""
    monkeypatch.setattr(chunks, "BLOCK_BYTES", 1 << 16)   # a block: ~1,300 of the ids

    def peak() -> int:
        tracemalloc.start()
        try:
            src = streamed(uuid_file, "--batch-size", "1000")
            assert sum(len(batch) for batch in src.batches) == src.total == N_USERS
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    text_bytes = N_USERS * 85    # a 36-character str object each
    for batch in streamed(uuid_file).batches:   # imports and first-use caches: not the streaming's
        pass
    assert peak() < 0.7 * text_bytes   # the keys, a few copies while merging, a block and a batch

    class TextSet:   # the broken variant's count
        def __init__(self):
            self.ids = set()

        def add(self, ids):
            self.ids.update(ids.tolist())

        def __len__(self):
            return len(self.ids)
    interning = RatingFile.again
    monkeypatch.setattr(RatingFile, "again",
                        lambda self, report=None, intern=None: interning(self, report, True))
    monkeypatch.setattr(source_module, "DistinctIds", TextSet)
    assert peak() > 1.2 * text_bytes
