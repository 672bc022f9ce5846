"""numba's compiled kernels are cached per state of the package's sources (sketchrec/_kernel_cache):
an edit of a helper that a kernel inlines from another module must not leave the old one running."""

import os
import subprocess
import sys

from sketchrec._kernel_cache import sources_stamp


def test_an_edit_of_any_source_changes_the_stamp(tmp_path):
    (tmp_path / "kernel.py").write_text("def k(): return helper()\n")
    (tmp_path / "helper.py").write_text("def helper(): return 1\n")
    before = sources_stamp([tmp_path])
    assert sources_stamp([tmp_path]) == before
    (tmp_path / "helper.py").write_text("def helper(): return 2\n")   # the kernel file untouched
    assert sources_stamp([tmp_path]) != before


def test_only_modules_using_numba_count_where_asked(tmp_path):
    (tmp_path / "kernel.py").write_text("import numba\n")
    (tmp_path / "routes.py").write_text("ROUTES = 1\n")
    before = sources_stamp([tmp_path], (tmp_path,))
    (tmp_path / "routes.py").write_text("ROUTES = 2\n")     # no kernel can see it: same cache
    assert sources_stamp([tmp_path], (tmp_path,)) == before
    (tmp_path / "kernel.py").write_text("import numba  # edited\n")
    assert sources_stamp([tmp_path], (tmp_path,)) != before


def test_kernels_are_cached_under_the_stamp_of_the_sources(tmp_path):
    # a fresh process, as a user's: the learner's kernel caches in NUMBA_CACHE_DIR/<stamp>, not in
    # the __pycache__ beside _sgd.py (where numba would check _sgd.py's own stamp only)
    probe = ("import sketchrec, numba\n"
             "from sketchrec.models._sgd import _predict\n"
             "from sketchrec._kernel_cache import _roots, sources_stamp\n"
             "print(_predict._cache._cache_path)\n"
             "from sketchrec._kernel_cache import NUMBA_ONLY\n"
             "print(sources_stamp(_roots(), tuple(_roots(NUMBA_ONLY))))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    path, stamp = out
    assert path.startswith(str(tmp_path / stamp) + os.sep), path
