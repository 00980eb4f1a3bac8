"""Adversarial submissions against the grader's sandbox: every family of attack of issue 13.

Each test builds a notebook from the ex01 master (12 points: q1 kl_categorical 4, q2
kl_from_logits 4, q3 a number 2, q4 a letter 2) plus an attack, grades it, and asserts

* the score the submission deserves: 0 when the attack tries to obtain answers it did not
  compute, or exactly the honest points when the attack only tries to do damage;
* a bound on the wall time;
* that nothing is left behind: no process the notebook started (each attack puts a unique
  marker into the command line of what it spawns) and no temporary directory of the grader
  (the grader's temporary root is a per-test directory that must be empty afterwards).

Every attack was first run against the grader of commit f9de2cc (an audit hook in the
student's process, no OS isolation), where each of these tests fails.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import nbformat
import pytest

from grading_helpers import (FULL, WRONG_ANSWERS, master_cells, messages, points, replace_function,
                             write_nb)
from klbook_grader import grader as G
from klbook_grader.grader import grade

REPO = Path(G.__file__).resolve().parents[1]        # the checkout whose grader is under test
MASTER = REPO / "exercises" / "masters" / "ex01_kl_definition.ipynb"
HIDDEN = REPO / "klbook_grader" / "hidden"
KLBOOK = [sys.executable, "-m", "klbook_grader.cli"]

# Executes the solution cells of a master notebook's text in the notebook's globals.
STEAL = '''
def _steal(text):
    import json as _json
    nb = _json.loads(text)
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            if "check(" not in src:
                exec(src, globals())
'''


def processes_with(marker: str) -> list[int]:
    """Processes (on the whole machine) whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def children_of(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != b"Z":
            kids.append(int(entry))
    return kids


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A unique marker, a private temporary root for the grader, and the leftover checks."""
    marker = f"klbook-attack-{uuid.uuid4().hex[:12]}"
    gtmp = tmp_path / "grader-tmp"
    gtmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(gtmp))
    cli_env = {**os.environ, "TMPDIR": str(gtmp)}
    spare = set(children_of(os.getpid()))
    state = {"marker": marker, "gtmp": gtmp, "cli_env": cli_env, "keep": set()}
    yield state
    leftovers = processes_with(marker)
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    kids = set(children_of(os.getpid())) - spare - state["keep"]
    assert not leftovers, f"processes left behind by the notebook: {leftovers}"
    assert not kids, f"child processes left behind by the grader: {sorted(kids)}"
    left = list(gtmp.iterdir())
    assert not left, f"files left behind in the grader's temporary root: {left}"


def run_cli(args: list[str], cli_env: dict, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(KLBOOK + args, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env=cli_env)


# ---------------------------------------------------------------- 1. reading the answers
def _second_checkout(tmp_path: Path) -> Path:
    other = tmp_path / "checkout2" / "exercises" / "masters"
    other.mkdir(parents=True)
    (other / MASTER.name).write_bytes(MASTER.read_bytes())
    return other / MASTER.name


READERS = {
    "plain path": "_steal(open({master!r}).read())",
    "dir_fd": ("import os\nfd = os.open({repo!r}, os.O_RDONLY)\n"
               "f = os.open('exercises/masters/ex01_kl_definition.ipynb', os.O_RDONLY, dir_fd=fd)\n"
               "_steal(os.read(f, 10**7).decode())"),
    "patched path helper": ("import posixpath\nreal = posixpath.abspath\n"
                            "posixpath.abspath = lambda p: '/nonexistent/harmless'\n"
                            "try:\n    text = open({master!r}).read()\nfinally:\n"
                            "    posixpath.abspath = real\n_steal(text)"),
    "second checkout": "_steal(open({second!r}).read())",
    "proc root": ("import os\nfor root in ('/proc/self/root', '/proc/1/root', '/proc/1/cwd/..'):\n"
                  "    try:\n        _steal(open(root + {master!r}).read())\n        break\n"
                  "    except OSError:\n        pass\nelse:\n    raise OSError('not found')"),
    "hidden reference": ("ref = {{}}\nexec(open({reference!r}).read(), ref)\n"
                         "kl_categorical, kl_from_logits = ref['kl_categorical'], ref['kl_from_logits']"),
    "editable install finder": ("import sys, glob\n"
                                "for d in [p for p in sys.path if 'site-packages' in p]:\n"
                                "    sys.path.append(d)\n"
                                "import importlib\n"
                                "for f in glob.glob(sys.path[-1] + '/__editable__*finder.py'):\n"
                                "    m = importlib.import_module(f.split('/')[-1][:-3])\n"
                                "    m.install()\n"
                                "for name in [m for m in sys.modules if m.startswith('klbook_lib')]:\n"
                                "    del sys.modules[name]\n"
                                "from klbook_grader.hidden.reference import kl_categorical, kl_from_logits"),
}


@pytest.mark.parametrize("how", sorted(READERS))
def test_the_masters_and_hidden_reference_cannot_be_read(env, tmp_path, how):
    code = READERS[how].format(master=str(MASTER), repo=str(REPO), second=str(_second_checkout(tmp_path)),
                               reference=str(HIDDEN / "reference.py"))
    path = write_nb(tmp_path / "sub", master_cells()[:1] + [WRONG_ANSWERS, STEAL, code])
    t = time.monotonic()
    r = grade(path)
    assert time.monotonic() - t < 30
    assert r["score"] == 0, (how, points(r), r["notes"])
    assert any(n.startswith("cell 4 failed") for n in r["notes"]), r["notes"]


# ---------------------------------------------------------------- 2. forged results
ESCAPEE = r'''
import json, os, sys, time
grader, out_json = int(sys.argv[1]), sys.argv[2]
try:
    stdout = open(f"/proc/{grader}/fd/1", "w")
except OSError:
    stdout = None
deadline = time.time() + 30
while os.path.exists(f"/proc/{grader}") and time.time() < deadline:
    time.sleep(0.05)
fake = {"exercise": "ex01_kl_definition", "score": 12.0, "max_score": 12.0, "questions": [], "notes": []}
try:
    with open(out_json, "w") as fh:
        fh.write(json.dumps(fake))
except OSError:
    pass
if stdout is not None:
    stdout.write("Score: 12/12\n")
    stdout.flush()
'''

SPAWN = '''
import os, sys, subprocess
args = [sys.executable, "-c", {child!r}, str(os.getppid()), {out!r}, {marker!r}]
try:
    import _posixsubprocess      # raises no audit event; call_setsid=True leaves the process group
    r, w = os.pipe()
    _posixsubprocess.fork_exec(args, [os.fsencode(sys.executable)], True, (), None, None,
                               -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None,
                               -1, None, False)
except TypeError:
    subprocess.Popen(args, start_new_session=True)
if os.fork() == 0:                # and a classic double-forked daemon
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, args)
    os._exit(0)
'''


def test_an_escaped_process_cannot_rewrite_the_grade(env, tmp_path):
    out = tmp_path / "result.json"
    spawn = SPAWN.format(child=ESCAPEE, out=str(out), marker=env["marker"])
    path = write_nb(tmp_path / "sub", master_cells()[:1] + [WRONG_ANSWERS, spawn])
    t = time.monotonic()
    res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"])
    assert time.monotonic() - t < 60
    time.sleep(1.5)                   # give an escaped process time to act
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert [ln for ln in lines if ln.startswith("Score:")] == ["Score: 0/12"], lines[-3:]
    assert json.loads(out.read_text())["score"] == 0


# ---------------------------------------------------------------- 3. hangs and crashes
def test_a_fifo_or_symlink_in_place_of_the_output_file_changes_nothing(env, tmp_path):
    out = tmp_path / "result.json"
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    attack = (f"import os\nout = {str(out)!r}\n"
              "try:\n    os.remove(out)\nexcept OSError:\n    pass\n"
              "try:\n    os.mkfifo(out)\nexcept OSError:\n"
              f"    os.symlink({str(precious)!r}, out)")
    path = write_nb(tmp_path / "sub", master_cells() + [attack])
    t = time.monotonic()
    try:
        res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"], timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the grader hung on its output file")
    assert time.monotonic() - t < 60
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "Score: 12/12"
    assert out.is_file() and not out.is_symlink()
    assert json.loads(out.read_text())["score"] == 12
    assert precious.read_text() == "keep me"


def test_a_fifo_already_at_the_output_path_does_not_hang_the_grader(env, tmp_path):
    out = tmp_path / "result.json"
    os.mkfifo(out)
    res = run_cli(["grade", str(MASTER), "--json", str(out)], env["cli_env"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["score"] == 12


def test_signals_reach_neither_the_grader_nor_other_processes(env, tmp_path):
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", env["marker"] + "-decoy"])
    env["keep"].add(decoy.pid)
    attack = ("import os, signal\n"
              "for sig in (signal.SIGSTOP, signal.SIGTERM):\n"
              "    try:\n        os.kill(os.getppid(), sig)\n    except OSError:\n        pass\n"
              f"os.kill({decoy.pid}, signal.SIGKILL)")
    path = write_nb(tmp_path / "sub", master_cells() + [attack])
    t = time.monotonic()
    proc = subprocess.Popen(KLBOOK + ["grade", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env=env["cli_env"])
    try:
        stdout, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.communicate()
        pytest.fail("the grader was stopped by the notebook")
    finally:
        alive = decoy.poll() is None
        decoy.kill()
        decoy.wait()
    assert time.monotonic() - t < 60
    assert alive, "the notebook killed a process outside its sandbox"
    assert proc.returncode == 0 and stdout.strip().splitlines()[-1] == "Score: 12/12"


def test_kill_all_processes_only_ends_the_notebooks_own(env, tmp_path):
    from klbook_grader import sandbox          # refuses to run this without OS isolation

    assert sandbox.backend().isolated                # kill(-1) outside a sandbox would end the session
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", env["marker"] + "-decoy"])
    env["keep"].add(decoy.pid)
    # an interlock in the notebook too: kill(-1) only inside a PID namespace whose init is bwrap
    kill_all = ("import os, signal\n"
                "with open('/proc/1/comm') as fh:\n    init = fh.read().strip()\n"
                "if init != 'bwrap' or os.getpid() > 1000:\n"
                "    raise RuntimeError('not inside a PID namespace of its own: no kill(-1)')\n"
                "pid = os.fork()\n"
                "if pid == 0:\n    os.kill(-1, signal.SIGKILL)   # every process it may signal but itself\n"
                "else:\n    os.waitpid(pid, 0)")
    path = write_nb(tmp_path / "sub", master_cells() + [kill_all])
    try:
        r = grade(path)
        alive = decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
    assert alive
    assert r["score"] == 12
    assert any(n.startswith("cell 10 ") and "ended" in n for n in r["notes"]), r["notes"]


# Python expressions, evaluated in the notebook, for the bytes it writes into the result pipe.
MALFORMED = {
    "wrong types": ("b'{\"answers\": {\"q1\": {\"cases\": [{\"value\": {\"t\": \"array\", \"shape\": 5,'"
                    " b' \"v\": 1}}]}}, \"cells\": [{\"status\": \"error\", \"index\": \"x\"}], \"notes\": 5}'"),
    "deep nesting": "b'[' * 200_000 + b']' * 200_000",
    "binary": "b'\\xff\\xfe\\x00garbage\\n' * 1000",
    "hostile events": repr(b"\n".join(json.dumps(e).encode() for e in [
        {"ev": "q", "q": "q1", "t": "start"},
        {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "array", "shape": [-1], "v": "x"}}},
        {"ev": "case", "q": "q1", "j": 10**9, "r": {"value": {"t": "num", "v": 1e999}}},
        {"ev": "case", "q": "nope", "j": 0, "r": {"error": ["x"]}},
        {"ev": "cell", "i": "x", "t": "end", "ok": "yes"},
        {"ev": "note", "text": {"a": 1}},
        {"ev": "q", "q": "q1", "t": "end"},
        {"ev": "done"},
    ]) + b"\n"),
    "huge line": "b'{\"ev\": \"note\", \"text\": \"' + b'x' * 30_000_000",
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_reports_from_the_sandbox_are_survived(env, tmp_path, kind):
    # writes into every pipe it holds (the result pipe among them), then ends the process
    attack = ("import os, stat\n"
              f"data = {MALFORMED[kind]}\n"
              "for fd in range(3, 64):\n"
              "    try:\n        st = os.fstat(fd)\n    except OSError:\n        continue\n"
              "    if stat.S_ISFIFO(st.st_mode):\n"
              "        try:\n            os.write(fd, data)\n        except OSError:\n            pass\n"
              "os._exit(0)")
    out = tmp_path / "result.json"
    path = write_nb(tmp_path / "sub", master_cells() + [attack])
    t = time.monotonic()
    res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"])
    assert time.monotonic() - t < 60
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["score"] == 12, result
    assert res.stdout.strip().splitlines()[-1] == "Score: 12/12"


def test_deep_directories_and_big_files_leave_nothing_behind(env, tmp_path):
    attack = ("import os\nhere = os.getcwd()\n"
              "try:\n    for i in range(1500):\n        os.mkdir('d')\n        os.chdir('d')\n"
              "finally:\n    os.chdir(here)\n"
              "block = b'x' * (1 << 20)\n"
              "for k in range(6):\n"
              "    with open(f'big{k}', 'wb') as fh:\n"
              "        for _ in range(60):\n            fh.write(block)")
    out = tmp_path / "result.json"
    path = write_nb(tmp_path / "sub", [attack] + master_cells())
    t = time.monotonic()
    res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"])
    assert time.monotonic() - t < 60
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(out.read_text())["score"] == 12
    # the env fixture checks that the grader's temporary root is empty


# Writes one forged event into every pipe the process holds from fd 3 up (the result pipe
# among them), and finds where the runner stands by reading its frames.
FORGE = r'''
import json as _json, os as _os, stat as _stat, sys as _sys, time as _time

def _forge(*events):
    data = b"".join(b"\n" + _json.dumps(e).encode() + b"\n" for e in events)
    for fd in range(3, 64):
        try:
            if _stat.S_ISFIFO(_os.fstat(fd).st_mode):
                _os.write(fd, data)
        except OSError:
            pass

def _runner_local(*names):
    f = _sys._getframe(1)
    while f is not None:
        if all(n in f.f_locals for n in names):
            return [f.f_locals[n] for n in names]
        f = f.f_back
    raise RuntimeError(names)

def _sleep_forging(seconds, every, events):
    end = _time.monotonic() + seconds
    while _time.monotonic() < end:
        try:
            _time.sleep(every)          # the runner's own alarm is swallowed
        except BaseException:
            pass
        _forge(*events())
'''

SLOW_CALL = '''
_honest_kl = kl_categorical
def kl_categorical(p, q):
    qid, j = _runner_local("qid", "j")
    _sleep_forging(2.0, 0.3, lambda: [{"ev": "case", "q": qid, "j": j, "r": {"error": "wait"}},
                                      {"ev": "call", "q": qid, "j": j}])
    return _honest_kl(p, q)
'''

SLOW_CELL = '''
(index,) = _runner_local("index", "src")
_sleep_forging(12.0, 1.0, lambda: [{"ev": "cell", "i": index, "t": "end", "ok": True},
                                   {"ev": "cell", "i": index, "t": "start"}])
'''


def test_forged_runner_steps_do_not_reset_the_timers(env, tmp_path):
    """Issue 36: a call that writes `case j` then `call j`, and a cell that writes `cell end`
    then `cell start`, into the result pipe restarted the grader's clocks (a 12 s call scored
    full marks under a 5 s limit). Each clock now starts at the first message of its cell or
    call and is never restarted; call ids must increase."""
    cells = master_cells()
    hit = [i for i, c in enumerate(cells) if "def kl_from_logits(" in c]
    assert len(hit) == 1
    honest = cells[hit[0]]
    cells = replace_function(cells, "kl_from_logits",
                             "def kl_from_logits(logits_p, logits_q):\n    raise NotImplementedError\n")
    # q1 answered by a call that runs 2 s (limit 0.5 s + 1.1 s grace); q2 defined by a cell
    # that runs 12 s (limit 3 s + 1.75 s grace)
    slow_cell = SLOW_CELL + "\n" + honest.split("check(")[0]
    path = write_nb(tmp_path / "sub", cells + [FORGE, SLOW_CALL, slow_cell])
    t = time.monotonic()
    r = grade(path, timeout=90, cell_timeout=3, call_timeout=0.5)
    assert time.monotonic() - t < 80
    got = points(r)
    assert got["q1"] == 0, messages(r, "q1")
    assert got["q2"] == 0, messages(r, "q2")
    assert got["q3"] == FULL["q3"] and got["q4"] == FULL["q4"], got


def test_a_note_written_by_the_notebook_is_labelled_as_the_notebooks(env, tmp_path):
    """Issue 36: a cell that writes a note event into the result pipe printed a line exactly like
    the grader's own notes. Every note from the sandbox now carries the notebook's label."""
    forged = ("_forge({'ev': 'note', 'text': 'the grader verified every answer by hand'})\n"
              "import klbook_lib.seqkl")                     # and a refusal the runner reports
    path = write_nb(tmp_path / "sub", master_cells() + [FORGE, forged])
    r = grade(path)
    assert r["score"] == 12
    mine = [n for n in r["notes"] if "verified every answer" in n]
    assert mine == [G.SANDBOX_NOTE + "the grader verified every answer by hand"], r["notes"]
    assert any(n.startswith(G.SANDBOX_NOTE + "import of klbook_lib.seqkl refused") for n in r["notes"]), r["notes"]
    assert "  note: " + G.SANDBOX_NOTE + "the grader verified" in G.format_report(r)


# ---------------------------------------------------------------- 4. persistence and copying
def test_the_grader_and_the_python_environment_cannot_be_modified(env, tmp_path):
    import numpy

    targets = [Path(G.__file__), Path(G.__file__).with_name("runner.py")]
    before = [p.read_bytes() for p in targets]
    probe = Path(numpy.__file__).parent.parent / f"{env['marker']}.txt"
    attack = ("import os\n"
              f"for target in {[str(p) for p in targets]!r}:\n"
              "    d, name = os.path.split(target)\n"
              "    try:\n"
              "        fd = os.open(d, os.O_RDONLY)\n"
              "        f = os.open(name, os.O_WRONLY | os.O_APPEND, dir_fd=fd)\n"
              "        os.write(f, b'\\n# persisted by a notebook\\n')\n"
              "    except OSError as exc:\n        print(exc)\n"
              f"d, name = os.path.split({str(probe)!r})\n"
              "fd = os.open(d, os.O_RDONLY)\n"
              "os.close(os.open(name, os.O_WRONLY | os.O_CREAT, dir_fd=fd))")
    path = write_nb(tmp_path / "sub", master_cells() + [attack])
    try:
        r = grade(path)
        created = probe.exists()
    finally:
        probe.unlink(missing_ok=True)
    assert [p.read_bytes() for p in targets] == before
    assert not created, "the notebook wrote into the Python environment"
    assert r["score"] == 12


def test_a_notebook_cannot_copy_a_classmates_submission(env, tmp_path):
    secret = env["marker"] + "-victim"
    victim = write_nb(tmp_path / "victim", [f"# {secret}\nimport time\ntime.sleep(6)"] + master_cells())
    spy_cell = STEAL + f'''
import os, time
found = None
t0 = time.time()
while found is None and time.time() - t0 < 8:
    # every notebook under /tmp, 8 levels deep: where graders keep their working copies
    # and where submissions wait to be graded
    candidates, stack, budget = [], [("/tmp", 0)], 200_000
    while stack and budget > 0:
        folder, depth = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        budget -= len(entries)
        for e in entries:
            if e.name.endswith(".ipynb"):
                candidates.append(e.path)
            elif depth < 8 and not e.name.startswith(("prev-", ".")) and e.is_dir(follow_symlinks=False):
                stack.append((e.path, depth + 1))
    for c in candidates:
        try:
            text = open(c).read()
        except OSError:
            continue
        if {secret!r} in text and c != os.path.abspath("ex01_kl_definition.ipynb"):
            found = text
            break
    time.sleep(0.2)
if found is not None:
    nb = __import__("json").loads(found)
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and "check(" not in src and "sleep" not in src:
            exec(src, globals())
'''
    spy = write_nb(tmp_path / "spy", master_cells()[:1] + [WRONG_ANSWERS, spy_cell])
    results = {}

    def run(name, p):
        results[name] = grade(p)

    threads = [threading.Thread(target=run, args=("victim", victim))]
    threads[0].start()
    time.sleep(0.5)
    threads.append(threading.Thread(target=run, args=("spy", spy)))
    threads[1].start()
    for th in threads:
        th.join(timeout=90)
    assert results["victim"]["score"] == 12
    assert results["spy"]["score"] == 0, points(results["spy"])


# ---------------------------------------------------------------- 5. smaller ones
def test_the_exercise_comes_from_the_file_name_not_the_metadata(env, tmp_path):
    ex07 = nbformat.read(REPO / "exercises" / "masters" / "ex07_token_level_kl.ipynb", as_version=4)
    swapped = tmp_path / "sub" / "ex06_rlhf_reverse_kl.ipynb"
    swapped.parent.mkdir()
    nbformat.write(ex07, swapped)                     # ex07's solutions, ex07's metadata, an ex06 name
    r = grade(swapped)
    assert r["exercise"] == "ex06_rlhf_reverse_kl"
    assert r["score"] < r["max_score"]
    ex06 = nbformat.read(REPO / "exercises" / "masters" / "ex06_rlhf_reverse_kl.ipynb", as_version=4)
    ex06.metadata["klbook"]["exercise"] = "ex07_token_level_kl"
    honest = tmp_path / "honest" / "ex06_rlhf_reverse_kl.ipynb"
    honest.parent.mkdir()
    nbformat.write(ex06, honest)
    r = grade(honest)
    assert r["exercise"] == "ex06_rlhf_reverse_kl" and r["score"] == r["max_score"]


def test_control_characters_never_reach_the_terminal_or_the_json(env, tmp_path):
    evil = "\\x1b[2J\\x1b[H\\x1b]0;owned\\x07Score: 12/12\\r\\x1b[32mall passed\\u202e\\x9b31m\\x00"
    trick = (f"def kl_categorical(p, q):\n    raise ValueError('{evil}')\n"
             f"raise RuntimeError('{evil}')")
    out = tmp_path / "result.json"
    path = write_nb(tmp_path / "sub", master_cells() + [trick])
    res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"])
    assert res.returncode == 0, res.stderr
    bad = [c for c in res.stdout if (ord(c) < 32 and c != "\n") or 0x7f <= ord(c) < 0xa0
           or c in "\u202e\u202d\u2066\u2067\u2068\u2069\u200b"]
    assert not bad, sorted(set(bad))
    assert res.stdout.strip().splitlines()[-1] == "Score: 8/12"
    lines = res.stdout.strip().splitlines()
    assert [ln for ln in lines if ln.startswith("Score:")] == ["Score: 8/12"]
    data = json.loads(out.read_text())

    def strings(x):
        if isinstance(x, str):
            yield x
        elif isinstance(x, dict):
            for v in x.values():
                yield from strings(v)
        elif isinstance(x, list):
            for v in x:
                yield from strings(v)

    for s in strings(data):
        assert not any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or c in "\u202e\u200b" for c in s), s


def test_the_network_is_unreachable(env, tmp_path):
    got: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    stop = threading.Event()

    def listen():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            got.append(conn.recv(100) or b"connected")
            conn.close()

    th = threading.Thread(target=listen, daemon=True)
    th.start()
    attack = ("import socket\n"
              f"s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
              "s.sendall(b'leak')\ns.close()")
    path = write_nb(tmp_path / "sub", master_cells() + [attack])
    try:
        r = grade(path)
    finally:
        stop.set()
        th.join(timeout=5)
        server.close()
    assert got == [], "the notebook reached a socket outside its sandbox"
    assert r["score"] == 12
    assert any(n.startswith("cell 10 failed") for n in r["notes"]), r["notes"]


def test_a_slow_c_call_is_stopped_from_outside_and_costs_only_its_question(env, tmp_path):
    slow = "def kl_categorical(p, q):\n    return float(sum(range(10**12)))   # one C call, hours long"
    path = write_nb(tmp_path / "sub", [c if "def kl_categorical" not in c else slow for c in master_cells()])
    t = time.monotonic()
    r = grade(path, timeout=40, cell_timeout=2, call_timeout=1)
    assert time.monotonic() - t < 40
    assert points(r) == {**FULL, "q1": 0}, (points(r), r["notes"])
    assert "did not return within 1 s" in messages(r, "q1")


def test_running_out_of_total_time_keeps_the_points_already_earned(env, tmp_path):
    cells = master_cells()
    slow_q3 = next(i for i, c in enumerate(cells) if "answer_q3 =" in c)
    slow_q4 = next(i for i, c in enumerate(cells) if "answer_q4 =" in c)
    cells[slow_q3] = "import time\ntime.sleep(3)\n" + cells[slow_q3]      # an honest slow cell
    cells[slow_q4] = "import time\ntime.sleep(30)\n" + cells[slow_q4]     # runs past the total limit
    path = write_nb(tmp_path / "sub", cells)
    t = time.monotonic()
    r = grade(path, timeout=10, cell_timeout=40)
    assert time.monotonic() - t < 25
    assert points(r) == {**FULL, "q4": 0}, (points(r), r["notes"])
    assert any("total time limit of 10 s" in n for n in r["notes"])


def test_time_magics_run_their_body(env, tmp_path):
    cells = master_cells()
    cells = ["%%time\n" + c if "def kl_categorical" in c else c for c in cells]
    cells = ["%time " + c.split("\n")[-2] if "answer_q3 =" in c else c for c in cells]
    assert any(c.startswith("%time answer_q3") for c in cells), cells
    cells.insert(1, "mu1, s1, mu2, s2 = 0.0, 1.0, 1.0, 2.0")
    path = write_nb(tmp_path / "sub", cells)
    r = grade(path)
    assert r["score"] == 12, (points(r), r["notes"])


# ---------------------------------------------------------------- what the sandbox is
MODES = ["root", "userns"] if os.geteuid() == 0 else ["userns"]


@pytest.fixture
def forced_mode(request, monkeypatch):
    """Build the sandbox the way ``request.param`` says, for this test only."""
    from klbook_grader import sandbox

    monkeypatch.setenv(sandbox.MODE_ENV, request.param)
    monkeypatch.setattr(sandbox, "_cached", None)
    monkeypatch.setattr(sandbox, "_cached_error", None)
    yield request.param


@pytest.mark.parametrize("forced_mode", MODES, indirect=True)
def test_inside_the_sandbox_only_the_environment_and_a_private_tmpfs_exist(env, tmp_path, forced_mode):
    """A notebook checks its own world; any failed assertion would show as a failed cell."""
    import numpy

    from klbook_grader import sandbox

    venv_file = Path(numpy.__file__)
    # a checkout under /tmp has its path inside the sandbox's private tmpfs, where writing is
    # allowed (and vanishes); the check below that nothing reached the real path covers it
    under_tmp = Path("/tmp") in REPO.parents
    repo_probe = "" if under_tmp else f"{str(REPO / 'probe')!r}, "
    probe = f'''
import os, socket, errno
assert os.getuid() != 0 and os.geteuid() != 0, "runs as root"
assert os.getcwd() == {sandbox.INSIDE_WORK!r}
assert os.path.isfile("ex01_kl_definition.ipynb")               # its own notebook, a copy
for hidden in ({str(REPO / "klbook_lib")!r}, {str(REPO / "klbook_grader")!r}, {str(REPO / "exercises")!r}, {str(REPO / ".git")!r},
               {str(tmp_path)!r}, "/home", "/root/.ssh", "/etc/passwd", "/etc/shadow", "/var", "/sys",
               "/usr/src", "/usr/local/src", "/usr/include", "/opt", "/srv", "/mnt"):
    assert not os.path.exists(hidden), hidden
assert {str(os.getpid())!r} not in os.listdir("/proc")           # the grader is not in its world
assert len([p for p in os.listdir("/proc") if p.isdigit()]) < 10
with open("/proc/self/net/dev") as fh:                          # its own network namespace
    assert [ln.split(":")[0].strip() for ln in fh.read().splitlines()[2:]] == ["lo"]
# issue 36: socket families on an allow-list (AF_UNIX, AF_INET, AF_INET6)
for fam, kind in ((socket.AF_UNIX, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_DGRAM),
                  (socket.AF_INET6, socket.SOCK_DGRAM)):
    socket.socket(fam, kind).close()
for s in socket.socketpair():
    s.close()
for fam in (getattr(socket, "AF_VSOCK", 40), socket.AF_NETLINK, socket.AF_PACKET, 0, 3, 9, 11, 1000):
    try:
        socket.socket(fam, socket.SOCK_DGRAM).close()
    except PermissionError:
        continue
    except OSError as exc:
        raise AssertionError(f"socket family {{fam}}: {{exc}}")
    raise AssertionError(f"socket family {{fam}} created")
for target in ({str(venv_file)!r}, {str(venv_file.parent / "klbook-probe")!r}, "/usr/probe",
               "/probe", {repo_probe}"/etc/probe", "/klbook/probe"):
    try:
        open(target, "a").close()
    except OSError as exc:
        assert exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM), exc
    else:
        raise AssertionError("wrote " + target)
st = os.statvfs("/tmp")
assert st.f_blocks * st.f_frsize <= {sandbox.Limits().disk_bytes}, "the tmpfs is not size-limited"
import resource
assert resource.getrlimit(resource.RLIMIT_NPROC)[1] == {sandbox.Limits().processes}
assert resource.getrlimit(resource.RLIMIT_AS)[1] == {sandbox.Limits().memory_bytes}
block = b"x" * (1 << 20)
try:
    with open("/tmp/fill", "wb") as fh:
        for _ in range(400):
            fh.write(block)
except OSError as exc:
    assert exc.errno in (errno.ENOSPC, errno.EFBIG), exc
else:
    raise AssertionError("wrote 400 MB")
finally:
    os.remove("/tmp/fill")
'''
    r = grade(write_nb(tmp_path / "sub", [probe] + master_cells()))
    assert r["notes"] == [], r["notes"]
    assert r["score"] == 12
    assert r["isolation"].startswith("bubblewrap")
    assert not (REPO / "probe").exists()
    assert ("user id" if forced_mode == "root" else "user namespace") in r["isolation"]
    assert not (venv_file.parent / "klbook-probe").exists()


def test_without_bubblewrap_the_grader_refuses_unless_told_it_is_unsafe(env, tmp_path):
    no_bwrap = {**env["cli_env"], "KLBOOK_BWRAP": str(tmp_path / "no-such-bwrap")}
    res = run_cli(["grade", str(MASTER)], no_bwrap)
    assert res.returncode == 2
    assert "bubblewrap" in res.stderr and "apt-get install bubblewrap" in res.stderr
    assert "--unsafe-no-isolation" in res.stderr
    assert "Score:" not in res.stdout
    res = run_cli(["grade", str(MASTER), "--unsafe-no-isolation"], no_bwrap)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert "WARNING: graded without isolation" in res.stdout and lines[-1] == "Score: 12/12"


def test_unsafe_mode_still_grades_and_cleans_up_deep_trees(env, tmp_path):
    deep = ("import os\nhere = os.getcwd()\n"
            "try:\n    for i in range(1500):\n        os.mkdir('d')\n        os.chdir('d')\n"
            "    os.chmod('.', 0)\nfinally:\n    os.chdir(here)")
    r = grade(write_nb(tmp_path / "sub", [deep] + master_cells()), unsafe_no_isolation=True)
    assert r["score"] == 12 and r["isolation"].startswith("none")
    # the env fixture checks that the temporary directory is gone


def test_remove_tree_handles_depth_permissions_and_links(tmp_path):
    from klbook_grader.sandbox import remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    top = tmp_path / "top"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for i in range(1500):            # 1500 levels of "dd/": deeper than recursion or PATH_MAX allow
        os.mkdir("dd", dir_fd=fd)
        new = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = new
        if i % 300 == 0:
            os.symlink(str(outside), "link", dir_fd=fd)
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    os.fchmod(fd, 0)                            # the deepest directory: no permissions at all
    os.close(fd)
    (top / "locked").mkdir()
    (top / "locked" / "f").write_text("x")
    os.chmod(top / "locked", 0)
    remove_tree(top)
    assert not top.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    remove_tree(top)                             # a missing tree is fine


def test_a_question_can_declare_its_own_time_limit(env, tmp_path, monkeypatch):
    """Long calls (issue 14's training runs) get their own limit, here smaller than the default."""
    import dataclasses

    from klbook_grader.hidden import bank

    real = bank.questions

    def with_limit(exercise):
        return [dataclasses.replace(q, timeout=0.5) if q.id == "q1" else q for q in real(exercise)]

    monkeypatch.setattr(bank, "questions", with_limit)
    slow = "def kl_categorical(p, q):\n    import time\n    time.sleep(2)\n    return 0.0"
    cells = [slow if "def kl_categorical" in c else c for c in master_cells()]
    cells = [c for c in cells if 'check("q1")' not in c]
    r = grade(write_nb(tmp_path / "sub", cells))
    assert points(r) == {**FULL, "q1": 0}
    assert "did not return within 0.5 s" in messages(r, "q1")
    assert all("seconds" in q for q in r["questions"])


def test_clean_text_and_the_report_reader():
    from klbook_grader import protocol

    assert protocol.clean("a\x1b[31mred\x1b[0m\tb\r\nc\u202ed\x00e\x9b2Jf\x1b]0;t\x07g") == "ared b c d efg"
    assert protocol.clean("中文 ok") == "中文 ok"
    reader = protocol.Reader(3, [{"id": "q1", "kind": "function", "cases": [{}, {}]},
                                 {"id": "q2", "kind": "value", "cases": []}])
    good = [{"ev": "cell", "i": 2, "t": "start"}, {"ev": "cell", "i": 0, "t": "end", "ok": False, "error": "x"},
            {"ev": "q", "q": "q1", "t": "start"}, {"ev": "call", "q": "q1", "j": 1},
            {"ev": "case", "q": "q1", "j": 1, "r": {"value": {"t": "array", "lib": "numpy", "shape": [2, 1],
                                                                "v": [[1.0], [float("nan")]]}}},
            {"ev": "value", "q": "q2", "r": {"error": "no"}}, {"ev": "note", "text": "hi"}, {"ev": "done"}]
    bad = [{"ev": "cell", "i": 3, "t": "start"}, {"ev": "cell", "i": True, "t": "start"},
           {"ev": "cell", "i": 0, "t": "end", "ok": 1}, {"ev": "q", "q": "q9", "t": "start"},
           {"ev": "call", "q": "q1", "j": 2}, {"ev": "case", "q": "q2", "j": 0, "r": {"error": "x"}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "array", "lib": "numpy", "shape": [2],
                                                               "v": [1.0]}}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "array", "lib": "numpy", "shape": [-1],
                                                               "v": []}}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "num", "v": "1"}}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "num", "v": True}}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": {"t": "list", "v": 5}}},
           {"ev": "case", "q": "q1", "j": 0, "r": {"value": 1, "error": "x"}},
           {"ev": "note", "text": 5}, {"ev": "done", "extra": 1}, [1, 2], "done"]
    data = b"".join(json.dumps(e).encode() + b"\n" for e in good + bad)
    data += b"[" * 100_000 + b"]" * 100_000 + b"\n" + b"\xff\xfe\n" + b'{"ev": "done"'   # unfinished
    events = []
    for k in range(0, len(data), 777):          # arbitrary chunking
        events += reader.feed(data[k:k + 777])
    assert [e["ev"] for e in events] == [e["ev"] for e in good]
    assert events[1] == good[1] and events[4]["r"]["value"]["shape"] == [2, 1]
    assert reader.rejected == len(bad) + 2
    huge = protocol.Reader(1, [])
    assert huge.feed(b'{"ev": "note", "text": "' + b"x" * (protocol.MAX_LINE_BYTES + 10)) == []
    assert huge.feed(b'"}\n{"ev": "done"}\n') == [{"ev": "done"}]
    assert huge.rejected == 1


@pytest.mark.parametrize("mode", MODES)
def test_both_ways_of_building_the_sandbox_isolate(env, tmp_path, mode):
    """As root the runner drops to a fresh user id; otherwise bwrap uses a user namespace."""
    forced = {**env["cli_env"], "KLBOOK_SANDBOX_MODE": mode}
    out = tmp_path / "r.json"
    res = run_cli(["grade", str(MASTER), "--json", str(out)], forced)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "Score: 12/12"
    how = "fresh unprivileged user id" if mode == "root" else "user namespace"
    assert how in json.loads(out.read_text())["isolation"]
    code = READERS["dir_fd"].format(repo=str(REPO))
    steal = write_nb(tmp_path / "sub", master_cells()[:1] + [WRONG_ANSWERS, STEAL, code])
    res = run_cli(["grade", str(steal)], forced)
    assert res.returncode == 0 and res.stdout.strip().splitlines()[-1] == "Score: 0/12"


def test_an_exercise_can_offer_library_modules_to_the_sandbox(env, tmp_path, monkeypatch):
    """Issue 14's tasks train with the book's code: a question names the modules it offers."""
    import dataclasses

    from klbook_grader.hidden import bank

    real = bank.questions

    def offering(exercise):
        return [dataclasses.replace(q, library=("klbook_lib.divergences",)) if q.id == "q1" else q
                for q in real(exercise)]

    monkeypatch.setattr(bank, "questions", offering)
    uses_library = ("import klbook_lib.divergences as D\n"
                    "def kl_categorical(p, q):\n    return float(D.kl(np.asarray(p), np.asarray(q)))")
    cells = [uses_library if "def kl_categorical" in c else c for c in master_cells()]
    cells.append("import klbook_lib.estimators")
    r = grade(write_nb(tmp_path / "sub", cells))
    assert points(r)["q1"] > 0, messages(r, "q1")
    assert any("import of klbook_lib.estimators refused" in n for n in r["notes"]), r["notes"]


def test_a_regular_install_of_the_library_is_replaced_by_its_public_copy(tmp_path, monkeypatch):
    """With ``pip install .`` (not editable) the hidden tests sit in site-packages, which the
    sandbox must see: the command binds the public copy over that one folder only."""
    import site as site_module

    from klbook_grader import sandbox

    sp = tmp_path / "venv" / "lib" / "site-packages"
    (sp / "klbook_grader" / "hidden").mkdir(parents=True)
    (sp / "klbook_lib").mkdir()
    monkeypatch.setattr(site_module, "getsitepackages", lambda: [str(sp)])
    monkeypatch.setattr(sandbox, "PACKAGE_DIR", sp / "klbook_lib")
    monkeypatch.setattr(sandbox, "GRADING_DIR", sp / "klbook_grader")
    monkeypatch.setattr(sandbox, "REPO_DIR", sp)
    staging = tmp_path / "staging"
    cmd = sandbox.command(sandbox.Backend(mode="userns", bwrap="bwrap"), staging, sandbox.Limits())
    pairs = list(zip(cmd, cmd[1:], cmd[2:]))
    assert ("--ro-bind", str(sp), str(sp)) in pairs
    for package in ("klbook_lib", "klbook_grader"):       # each package by its public copy
        assert ("--ro-bind", str(staging / "lib" / package), str(sp / package)) in pairs
        assert pairs.index(("--ro-bind", str(staging / "lib" / package), str(sp / package))) > \
            pairs.index(("--ro-bind", str(sp), str(sp)))
    assert str(sp) not in [b for a, b in zip(cmd, cmd[1:]) if a == "--tmpfs"]


def test_a_checkout_inside_the_environment_is_masked(tmp_path, monkeypatch):
    """An editable install whose repository lies inside a bound directory (a conda prefix,
    say) is hidden behind an empty tmpfs, the environment's own folders bound again."""
    import site as site_module
    import sys as sys_module

    from klbook_grader import sandbox

    prefix = tmp_path / "conda"
    repo = prefix / "book"
    sp = repo / ".venv" / "lib" / "site-packages"
    sp.mkdir(parents=True)
    (repo / "klbook_lib").mkdir()
    (repo / "klbook_grader").mkdir()
    monkeypatch.setattr(sys_module, "prefix", str(prefix))
    monkeypatch.setattr(site_module, "getsitepackages", lambda: [str(sp)])
    monkeypatch.setattr(sandbox, "PACKAGE_DIR", repo / "klbook_lib")
    monkeypatch.setattr(sandbox, "GRADING_DIR", repo / "klbook_grader")
    monkeypatch.setattr(sandbox, "REPO_DIR", repo)
    cmd = sandbox.command(sandbox.Backend(mode="userns", bwrap="bwrap"), tmp_path / "st", sandbox.Limits())
    text = " ".join(cmd)
    assert f"--tmpfs {repo} " in text and f"--remount-ro {repo} " in text
    assert text.index(f"--tmpfs {repo} ") < text.index(f"--ro-bind {sp} {sp}") < text.index(f"--remount-ro {repo}")


# ---------------------------------------------------------------- issue 23: seccomp, cgroups, limits
from klbook_grader import batch as B  # noqa: E402
from klbook_grader import cgroups, syscalls  # noqa: E402

NO_CGROUPS = not cgroups.support().available
CGROUP_REASON = f"no cgroups on this machine: {cgroups.support().reason}"

# Each probe asserts inside the sandbox; a failed assertion shows as a failed cell (a note).
KEYRING_PROBE = '''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr}
def refused(*args):
    r = libc.syscall(*args)
    return r == -1 and ctypes.get_errno() == errno.EPERM
assert refused({add_key}, b"user", b"klbook-{marker}", b"stolen", 6, -3), "add_key to the session keyring"
assert refused({add_key}, b"user", b"klbook-{marker}", b"stolen", 6, -4), "add_key to the user keyring"
assert refused({request_key}, b"user", b"{secret}", None, 0), "request_key of the grader's key"
assert refused(NR, 11, -3, None, 0), "KEYCTL_READ of the session keyring"
assert refused(NR, 6, -3), "KEYCTL_CLEAR of the session keyring"
assert refused(NR, 0, -3, 0), "KEYCTL_GET_KEYRING_ID"
'''

ESCAPES_PROBE = '''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(fn, *args):
    r = fn(*args)
    return r == -1 and ctypes.get_errno() == errno.EPERM
for flags in (0x10000000, 0x20000, 0x10020000, 0x40000000, 0x20000000):   # NEWUSER NEWNS ... NEWPID
    assert refused(libc.unshare, flags), hex(flags)
assert refused(libc.mount, b"none", b"/tmp/work", b"tmpfs", 0, None), "mount"
assert refused(libc.ptrace, 16, 1, None, None), "ptrace attach"
try:
    os.memfd_create("hold")
except PermissionError:
    pass
else:
    raise AssertionError("memfd_create")
assert not os.path.exists("/dev/ptmx")
for tty in ("/dev/ptmx", "/dev/pts/ptmx"):
    try:
        open(tty, "rb+").close()
    except OSError:
        pass
    else:
        raise AssertionError("opened " + tty)
try:
    with open("/dev/shm/fill", "wb") as fh:
        for _ in range(100):
            fh.write(b"x" * (1 << 20))
except OSError as exc:
    assert exc.errno in (errno.ENOSPC, errno.EFBIG), exc
else:
    raise AssertionError("wrote 100 MB into /dev/shm")
pid = os.fork()                                  # ordinary processes and threads still work
if pid == 0:
    os._exit(7)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
import threading
t = threading.Thread(target=lambda: None)
t.start()
t.join()
'''


def _add_key(name: str, value: bytes) -> int:
    """A key in this (the grader's) session keyring, as a secret the notebook must not reach."""
    import ctypes

    import pyseccomp

    nr = pyseccomp.resolve_syscall(pyseccomp.system_arch(), "add_key")
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(nr, b"user", name.encode(), value, len(value), -3)


@pytest.mark.parametrize("forced_mode", MODES, indirect=True)
def test_the_kernel_keyring_is_out_of_reach(env, tmp_path, forced_mode):
    import pyseccomp

    arch = pyseccomp.system_arch()
    secret = f"klbook-secret-{env['marker']}"
    assert _add_key(secret, b"the answer") > 0
    probe = KEYRING_PROBE.format(nr=syscalls.keyctl_number(), marker=env["marker"], secret=secret,
                                 add_key=pyseccomp.resolve_syscall(arch, "add_key"),
                                 request_key=pyseccomp.resolve_syscall(arch, "request_key"))
    r = grade(write_nb(tmp_path / "sub", [probe] + master_cells()))
    assert r["notes"] == [], r["notes"]
    assert r["score"] == 12 and "seccomp" in r["isolation"]


def test_a_key_cannot_carry_an_answer_to_the_next_student(env, tmp_path):
    """Issue 23's batch attack: the first notebook leaves the answer in a key, the second reads
    it. Both are graded one after the other in one batch; the second gets nothing."""
    import pyseccomp

    arch = pyseccomp.system_arch()
    leave = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"for ring in (-3, -4, -5):\n"
             f"    libc.syscall({pyseccomp.resolve_syscall(arch, 'add_key')}, b'user', b'klbook-q4', "
             f"b'C', 1, ring)\n")
    take = (f"import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nbuf = ctypes.create_string_buffer(8)\n"
            f"answer_q4 = None\n"
            f"for ring in (-3, -4, -5):\n"
            f"    k = libc.syscall({syscalls.keyctl_number()}, 10, ring, b'user', b'klbook-q4', 0)\n"
            f"    if k > 0 and libc.syscall({syscalls.keyctl_number()}, 11, k, buf, 8) > 0:\n"
            f"        answer_q4 = buf.value.decode()\n")
    klass = tmp_path / "class"
    write_nb(klass / "alice", master_cells()[:1] + [WRONG_ANSWERS, leave])
    write_nb(klass / "bob", master_cells()[:1] + [WRONG_ANSWERS, take])
    res = B.grade_class(klass, jobs=1)
    bob = next(s for st in res["students"] if st.name == "bob" for s in st.submissions)
    assert bob.result["score"] == 0, points(bob.result)


@pytest.mark.parametrize("forced_mode", MODES, indirect=True)
def test_namespaces_mounts_tracing_memfd_and_ptys_are_refused(env, tmp_path, forced_mode):
    r = grade(write_nb(tmp_path / "sub", [ESCAPES_PROBE] + master_cells()))
    assert r["notes"] == [], r["notes"]
    assert r["score"] == 12


@pytest.mark.skipif(NO_CGROUPS, reason=CGROUP_REASON)
def test_the_cgroup_bounds_the_memory_of_the_whole_sandbox(env, tmp_path):
    """Six processes of 150 MB each stay under the per-process limit but not under the
    sandbox's 512 MB: the kernel kills one of them, and the honest answers keep their points."""
    hog = '''
import os, time
kids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (150 << 20)
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
killed = 0
for pid in kids:
    status = os.waitpid(pid, 0)[1]
    killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
assert killed >= 1, "no process was stopped by the sandbox's memory limit"
'''
    r = grade(write_nb(tmp_path / "sub", [hog] + master_cells()),
              limits=G.Limits(total_memory_bytes=512 << 20))
    assert "cgroup v" in r["isolation"]
    assert r["score"] == 12, (points(r), r["notes"])
    assert all("code cell 1" not in n or "memory limit" in n for n in r["notes"]), r["notes"]


BUSY_NEIGHBOUR = '''
import os, signal, time
signal.signal(signal.SIGALRM, signal.SIG_IGN)
for i in range(60):
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        while True:
            pass
'''


@pytest.mark.slow
@pytest.mark.skipif(NO_CGROUPS, reason=CGROUP_REASON)
def test_a_busy_neighbour_in_a_batch_leaves_the_honest_notebook_its_marks(env, tmp_path):
    """Issue 23: 60 busy children beside an honest ex05 master, graded with --jobs 2."""
    honest = REPO / "exercises" / "masters" / "ex05_kl_in_practice.ipynb"
    klass = tmp_path / "class"
    (klass / "alice").mkdir(parents=True)
    (klass / "alice" / honest.name).write_bytes(honest.read_bytes())
    write_nb(klass / "mallory", [BUSY_NEIGHBOUR] + ["import time\ntime.sleep(15)"] * 3 + master_cells())
    res = B.grade_class(klass, jobs=2)
    alice = next(s for st in res["students"] if st.name == "alice" for s in st.submissions)
    assert alice.result["score"] == alice.result["max_score"] == 23, (points(alice.result),
                                                                       alice.result["notes"])


def test_without_cgroups_the_result_says_so_and_jobs_above_one_refuse(env, tmp_path):
    no_cg = {**env["cli_env"], cgroups.ENV: "none"}
    out = tmp_path / "r.json"
    res = run_cli(["grade", str(MASTER), "--json", str(out)], no_cg)
    assert res.returncode == 0, res.stderr
    assert "WARNING: no cgroups" in res.stdout and res.stdout.strip().splitlines()[-1] == "Score: 12/12"
    assert "NO cgroups (switched off by KLBOOK_CGROUP=none)" in json.loads(out.read_text())["isolation"]
    klass = tmp_path / "class"
    (klass / "alice").mkdir(parents=True)
    (klass / "alice" / MASTER.name).write_bytes(MASTER.read_bytes())
    res = run_cli(["grade", str(klass), "--csv", str(tmp_path / "g.csv"), "--jobs", "2"], no_cg)
    assert res.returncode == 2 and "--jobs 2" in res.stderr and "cgroups" in res.stderr, res.stderr
    assert "--jobs 1" in res.stderr and not (tmp_path / "g.csv").exists()
    res = run_cli(["grade", str(klass), "--csv", str(tmp_path / "g.csv"), "--jobs", "1"], no_cg)
    assert res.returncode == 0 and "WARNING: NO cgroups" in res.stdout, res.stdout


def test_cgroups_are_used_where_the_machine_has_them(env, tmp_path):
    s = cgroups.support()
    r = grade(MASTER)
    assert r["score"] == 12
    if s.available:
        assert f"cgroup v{s.version} per sandbox" in r["isolation"]
        mine = f"run-{os.getpid()}-"          # every run's group is gone afterwards (groups of
        for parent in map(Path, s.parents):   # another grader on the machine may be there)
            left = [p.name for p in parent.iterdir() if p.is_dir()] if parent.exists() else []
            assert not [n for n in left if n.startswith(mine)], (parent, left)
    else:
        assert "NO cgroups" in r["isolation"]


RACE = """
import sys, time
from klbook_grader import cgroups
s = cgroups.support()
made = failed = 0
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    try:
        cgroups.Cgroup(s, 64 << 20, 8).remove()
        made += 1
    except OSError as exc:
        failed += 1
        print("failed:", repr(exc))
print(made, failed)
"""


def test_graders_starting_and_ending_groups_at_once_never_fail(tmp_path):
    """Each v1 run removes the shared, empty ``klbook-grade/`` when it ends; another grader
    making its group at that moment must make the folder again, not fail (before the fix:
    about 2 % of 12,000 runs per process failed with three processes)."""
    if not cgroups.support().available:
        pytest.skip("no cgroups on this machine")
    script = tmp_path / "race.py"
    script.write_text(RACE)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), "4"], stdout=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    counts = [tuple(map(int, o.split()[-2:])) for o in outs]
    assert all(made > 100 for made, _ in counts), outs
    assert all(failed == 0 for _, failed in counts), outs


def test_a_notebook_built_to_blow_up_the_parser_costs_the_grader_nothing(env, tmp_path):
    import resource

    path = tmp_path / "ex01_kl_definition.ipynb"
    with open(path, "w") as fh:                          # 48 MB of empty cells
        fh.write('{"cells": [')
        fh.write(",".join(["{}"] * (16 << 20)))
        fh.write('], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = grade(path)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before       # kB
    assert r["score"] == 0 and "could not be read" in r["notes"][0], r["notes"]
    assert grown < 400_000, f"the grader grew by {grown / 1024:.0f} MB"


def test_a_notebook_of_a_million_cells_is_refused_before_the_grader_holds_them(env, tmp_path):
    """Issue 36: 1.1 million small code cells (40 MB) parsed fine and took the grader to 944 MB;
    the parser now refuses more than MAX_CELLS cells, and code cells above MAX_CODE_CHARS."""
    import resource

    path = tmp_path / "ex01_kl_definition.ipynb"
    cell = '{"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": null}'
    with open(path, "w") as fh:
        fh.write('{"cells": [' + ",".join([cell] * 400_000) + '], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = grade(path)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before       # kB
    assert r["score"] == 0 and "it has 400,000 cells, more than 5,000" in r["notes"][0], r["notes"]
    assert grown < 150_000, f"the grader grew by {grown / 1024:.0f} MB"
    big = write_nb(tmp_path / "big", ["x = 1\n" + "#" * (G.MAX_CODE_CHARS + 10)])
    r = grade(big)
    assert r["score"] == 0 and "more than 2,000,000 characters" in r["notes"][0], r["notes"]
    ok = write_nb(tmp_path / "ok", master_cells() + ["pass"] * 100)
    assert grade(ok)["score"] == 12


def test_notes_and_messages_are_capped(env, tmp_path):
    failing = [f"raise ValueError({i})" for i in range(3000)]
    out = tmp_path / "r.json"
    path = write_nb(tmp_path / "sub", failing + master_cells())
    res = run_cli(["grade", str(path), "--json", str(out)], env["cli_env"], timeout=300)
    assert res.returncode == 0 and res.stdout.strip().splitlines()[-1] == "Score: 12/12", res.stdout[-500:]
    r = json.loads(out.read_text())
    assert len(r["notes"]) == G.MAX_NOTES and "more notes (not shown)" in r["notes"][-1]
    assert len(res.stdout.splitlines()) < 100 and out.stat().st_size < 100_000
    assert G.cap([str(i) for i in range(5)], 3) == ["0", "1", "... and 3 more notes (not shown)"]


def test_the_report_survives_a_terminal_that_is_not_utf8(env, tmp_path):
    ascii_env = {**env["cli_env"], "PYTHONIOENCODING": "ascii:strict", "LC_ALL": "C"}
    klass = tmp_path / "class"
    for who in ("Jos\u00e9", "\u674e\u96f7", "bob"):
        (klass / who).mkdir(parents=True)
        (klass / who / "ex01_\u00e9t\u00e9.ipynb").write_bytes(MASTER.read_bytes())
    csv_path = tmp_path / "grades.csv"
    res = run_cli(["grade", str(klass), "--csv", str(csv_path)], ascii_env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Jos\\xe9" in res.stdout and "Summary: graded 3 notebook(s)" in res.stdout
    rows = csv_path.read_text(encoding="utf-8").splitlines()
    assert sum(r.endswith(",4,4,") or ",q1," in r for r in rows) >= 3
    assert len(list((tmp_path / "grades-json").iterdir())) == 3
    one = run_cli(["grade", str(klass / "bob" / "ex01_\u00e9t\u00e9.ipynb")], ascii_env)
    assert one.returncode == 0 and one.stdout.strip().splitlines()[-1] == "Score: 12/12", one.stderr


def test_two_students_never_share_a_json_file(tmp_path):
    hashed = B.json_filename("bob!")
    assert hashed.startswith("bob-") and hashed != "bob.json"
    twin = hashed[:-len(".json")]                       # a folder named like bob!'s file
    names = B.json_filenames(["bob!", twin, "bob", "Bob", "BOB", "alice"])
    assert len({f.casefold() for f in names.values()}) == 6, names
    assert names["alice"] == "alice.json" and names[twin] != hashed
    batch = {"students": [B.Student(n, tmp_path) for n in ("bob!", twin, "Bob", "bob")]}
    B.write_outputs(batch, tmp_path / "out" / "g.csv", tmp_path / "out" / "json")
    records = [json.loads(p.read_text())["student"] for p in (tmp_path / "out" / "json").iterdir()]
    assert sorted(records) == sorted(["bob!", twin, "Bob", "bob"])
