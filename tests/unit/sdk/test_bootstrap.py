"""The worker bootstrap runs a script exactly as `python script.py` would, and its post-import
hooks run after the module is imported, never before."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from sdk_helpers import PYTHON, subprocess_env

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp
    import os
    import pickle
    import sys

    class Point:                       # defined in __main__: pickling must find it there
        def __init__(self, x):
            self.x = x

    def square(p):
        return p.x * p.x

    if __name__ == "__main__":
        print("argv", sys.argv[1:])
        print("path0", os.path.realpath(sys.path[0]) == os.path.realpath(os.path.dirname(__file__)))
        print("main", type(pickle.loads(pickle.dumps(Point(3)))).__module__)
        with mp.get_context("spawn").Pool(1) as pool:    # a spawned child re-imports __main__
            print("spawn", pool.map(square, [Point(4)]))
        print("torch imported early", "torch" in sys.modules)
        sys.exit(int(sys.argv[1]))
""")


def test_bootstrap_runs_the_script_like_python_does(tmp_path):
    script = tmp_path / "sub" / "s.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    direct = subprocess.run([PYTHON, str(script), "3", "--flag"], capture_output=True, text=True,
                            env=subprocess_env(), cwd=tmp_path, timeout=120)
    boot = subprocess.run([PYTHON, "-m", "traceml_core.bootstrap", str(script), "3", "--flag"],
                          capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=120)
    assert boot.returncode == direct.returncode == 3, boot.stderr
    assert boot.stdout == direct.stdout, (boot.stdout, direct.stdout)
    assert "argv ['3', '--flag']" in boot.stdout and "main __main__" in boot.stdout
    assert "spawn [16]" in boot.stdout and "torch imported early False" in boot.stdout


def test_bootstrap_runs_a_module_and_keeps_the_traceback(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text(
        "import sys\nprint('module argv', sys.argv[1:], __name__)\nraise ValueError('boom in module')\n")
    boot = subprocess.run([PYTHON, "-m", "traceml_core.bootstrap", "-m", "pkg.train", "a"],
                          capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path, timeout=60)
    assert boot.returncode == 1
    assert "module argv ['a'] __main__" in boot.stdout
    assert "ValueError: boom in module" in boot.stderr and "pkg/train.py" in boot.stderr


def test_post_import_hook_runs_after_the_import_and_once():
    code = textwrap.dedent("""
        import sys
        from traceml_core.sdk import imports
        seen = []
        imports.when_imported("os", lambda m: seen.append(("os", hasattr(m, "getpid"))))
        imports.when_imported("email.mime", lambda m: seen.append(("email.mime", m.__name__)))
        assert seen == [("os", True)], seen           # already imported: at once
        assert "email.mime" not in sys.modules
        import email.mime
        import email.mime.text
        import email.mime
        print(seen)
    """)
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[('os', True), ('email.mime', 'email.mime')]"


def test_a_failing_hook_does_not_break_the_import():
    code = textwrap.dedent("""
        from traceml_core.sdk import imports
        imports.when_imported("csv", lambda m: 1 / 0)
        import csv
        print(csv.reader is not None)
    """)
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=subprocess_env(),
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert "setting up for csv failed (ZeroDivisionError" in out.stderr
