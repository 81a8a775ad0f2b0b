"""A stacks bundle always ends and stays small, whatever a rank sends (issue 22, items 4, 5, 16):
text that is not UTF-8, answers that cannot be read, answers over the size limit, and py-spy's header."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import threading

from actors.agent import thread_stacks as agent_stacks
from actors.agent.thread_stacks import take_stacks
from actors.controller.diagnosis import stacks_bundle as controller_stacks
from orchestrator.layout import STACKS_NAME
from orchestrator.manifest import read_manifest, verify_manifest
from orchestrator.models.common import utcnow
from orchestrator.models.diagnosis import Frame, RankStacks, ThreadStack
from orchestrator.models.requests import ProfileState
from orchestrator.settings import MIN_STACKS_MAX_RANK_BYTES
from orchestrator.stack_limits import answer_bytes
from orchestrator.storage import open_storage
from tests.support.fake_agents import ALL_REDUCE, make_controller, run, start_agents, until

ODD_FILE = "/job/tr\udcffain.py"  # a file name the OS gave as bytes that are not UTF-8
ODD_THREAD = "loader-\udc80"


def unchecked(bundle_id: str, agent_id: str, **fields) -> RankStacks:
    """An answer as it arrives unpickled from an agent: never validated."""
    values = dict(bundle_id=bundle_id, agent_id=agent_id, step=3, taken_at=utcnow(), threads=[], collectives=[])
    values.update(fields)
    return RankStacks.model_construct(**values)


def odd_answer(bundle_id: str, agent_id: str) -> RankStacks:
    frame = Frame.model_construct(filename=ODD_FILE, line=7, function="step", code="x = 1\udcfe", library=False)
    thread = ThreadStack.model_construct(thread_id=9, name=ODD_THREAD, training=True, frames=[frame])
    return unchecked(bundle_id, agent_id, threads=[thread], native="frame in lib\udcff.so", native_note=None)


async def bundle_with(home, replies: dict[int, object], world_size: int = 2, **overrides):
    """A bundle of fake ranks; ``replies[rank](bundle_id, agent_id)`` replaces that rank's answer."""
    c = make_controller(home, **overrides)
    agents = await start_agents(c, world_size)
    for rank, reply in replies.items():
        agent = agents[rank]
        agent.stacks = lambda bundle_id, agent=agent, reply=reply: reply(bundle_id, agent.info.agent_id)
    try:
        bundle = await c.stacks("run")
        page = await c.list()
    finally:
        for a in agents:
            await a.stop()
    return bundle, page


# ---- item 4: one odd byte -------------------------------------------------


def test_a_rank_with_a_non_utf8_file_and_thread_name_gives_a_bundle_that_ends_and_verifies(home):
    bundle, page = run(bundle_with(home, {1: odd_answer}))

    assert bundle.state == ProfileState.DONE
    assert [(p.id, p.state) for p in page.profiles] == [(bundle.id, ProfileState.DONE)]
    storage = open_storage(home)
    assert verify_manifest(storage, read_manifest(storage, "run", bundle.id)) == []
    rank1 = storage.get_bytes(f"run/{bundle.id}/stacks/rank1.txt").decode()
    assert 'File "/job/tr\ufffdain.py", line 7, in step' in rank1
    assert 'Thread 9 "loader-\ufffd"' in rank1 and "lib\ufffd.so" in rank1
    assert "tr\ufffdain.py:7 in step" in bundle.summary


def test_an_answer_that_cannot_be_read_makes_that_rank_missing_and_the_bundle_partial(home):
    def broken(bundle_id, agent_id):
        return unchecked(bundle_id, agent_id, threads="not a list of threads")

    bundle, page = run(bundle_with(home, {0: broken}, world_size=3))

    assert bundle.state == ProfileState.PARTIAL
    assert [m.rank for m in bundle.missing] == [0]
    assert bundle.missing[0].reason.startswith("its answer could not be read: ValidationError")
    assert page.profiles[0].state == ProfileState.PARTIAL


def test_when_no_answer_can_be_read_the_bundle_ends_failed_not_pending(home):
    def broken(bundle_id, agent_id):
        return unchecked(bundle_id, agent_id, step="three")

    bundle, page = run(bundle_with(home, {0: broken, 1: broken}))

    assert bundle.state == ProfileState.FAILED
    assert page.profiles[0].state == ProfileState.FAILED


def test_an_unexpected_error_while_grouping_ends_the_bundle_failed_with_why(home, monkeypatch):
    def broken_grouping(digests):
        raise RuntimeError("planted")

    monkeypatch.setattr(controller_stacks, "group_stacks", broken_grouping)

    bundle, page = run(bundle_with(home, {}))

    assert bundle.state == ProfileState.FAILED
    assert [(p.id, p.state, p.reason) for p in page.profiles] == [
        (bundle.id, ProfileState.FAILED, "the stacks could not be taken: RuntimeError: planted")
    ]


def test_the_agent_makes_non_utf8_names_valid_where_they_enter():
    release = threading.Event()
    started = threading.Event()
    idents: list[int] = []
    scope: dict = {}
    # A function whose code object names a file that is not UTF-8, as the import system gives it.
    exec(compile("def blocked(started, release, idents):\n    import threading\n    idents.append(threading.get_ident())\n"
                 "    started.set()\n    release.wait(30)\n", ODD_FILE, "exec"), scope)
    worker = threading.Thread(target=scope["blocked"], args=(started, release, idents), name=ODD_THREAD)
    worker.start()
    try:
        started.wait(10)
        stacks = take_stacks("stk-1", "agent", 1, idents[0], native=False)
    finally:
        release.set()
        worker.join(10)

    training = next(t for t in stacks.threads if t.training)
    assert training.name == "loader-\ufffd"
    assert "/job/tr\ufffdain.py" in [f.filename for f in training.frames]
    json.loads(stacks.model_dump_json())  # serialisable: the controller can write it


# ---- item 5: bounded answers, stored as they arrive ------------------------


def test_an_answer_over_the_limit_is_cut_and_the_bundle_says_so_for_that_rank(home):
    limit = MIN_STACKS_MAX_RANK_BYTES

    def huge(bundle_id, agent_id):
        frames = [Frame(filename=f"/job/deep{i}.py", line=i, function="recurse", code="recurse()") for i in range(2000)]
        threads = [ThreadStack(thread_id=1, name="train", training=True, frames=[*frames, *ALL_REDUCE])]
        threads += [ThreadStack(thread_id=i, name=f"pool-{i}", frames=frames[:50]) for i in range(2, 200)]
        return unchecked(
            bundle_id, agent_id, threads=threads, native="native frame\n" * 200_000, flight_recorder="{}" * 2**20
        )

    bundle, _ = run(bundle_with(home, {1: huge}, stacks_max_rank_bytes=limit))

    assert bundle.state == ProfileState.DONE
    assert [t.rank for t in bundle.truncated] == [1]
    note = bundle.truncated[0].note
    assert note.startswith("answer of ") and f"cut to the {limit}-byte limit" in note
    assert "flight recorder dump" in note and "native frames" in note and "threads other than" in note
    storage = open_storage(home)
    keys = storage.list(f"run/{bundle.id}/stacks/")
    assert keys == [f"run/{bundle.id}/stacks/rank0.txt", f"run/{bundle.id}/stacks/rank1.txt"]
    rank1 = storage.get_bytes(keys[1])
    assert len(rank1) <= limit and note.encode() in rank1
    # The innermost frames are kept: the group still says where rank 1 waits.
    assert bundle.groups[0].ranks == [1] and bundle.groups[0].where.startswith("all_reduce")
    assert json.loads(storage.get_bytes(f"run/{bundle.id}/{STACKS_NAME}"))["truncated"][0]["rank"] == 1


def test_the_agent_cuts_its_own_answer_to_the_limit_the_controller_sends():
    depth = 900

    def recurse(n: int, started: threading.Event, release: threading.Event) -> None:
        if n:
            recurse(n - 1, started, release)
        else:
            started.set()
            release.wait(30)

    started, release = threading.Event(), threading.Event()
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 200)
    workers = [threading.Thread(target=recurse, args=(depth // 4, threading.Event(), release)) for _ in range(20)]
    deep = threading.Thread(target=recurse, args=(depth, started, release), name="train-fn")
    try:
        for t in [*workers, deep]:
            t.start()
        started.wait(10)
        stacks = take_stacks("stk-1", "agent", 1, deep.ident, native=False, max_bytes=MIN_STACKS_MAX_RANK_BYTES)
    finally:
        release.set()
        for t in [*workers, deep]:
            t.join(10)
        sys.setrecursionlimit(old)

    assert answer_bytes(stacks) <= MIN_STACKS_MAX_RANK_BYTES
    assert stacks.truncated is not None and "threads other than the training thread" in stacks.truncated
    assert any(t.training for t in stacks.threads)


def test_each_answer_is_stored_as_it_arrives_not_once_every_rank_answered(home):
    async def go():
        c = make_controller(home, stacks_timeout_s=3.0)
        agents = await start_agents(c, 2)
        agents[1].stack = None  # never answers: the bundle waits out its timeout
        taking = asyncio.create_task(c.stacks("run"))
        storage = open_storage(home)
        stored_early = await until(
            lambda: any(k.endswith("/stacks/rank0.txt") for k in storage.list("run/")), timeout_s=30
        )
        done_early = taking.done()
        bundle = await taking
        for a in agents:
            await a.stop()
        return stored_early, done_early, bundle

    stored_early, done_early, bundle = run(go())
    assert stored_early and not done_early
    assert bundle.state == ProfileState.PARTIAL and [m.rank for m in bundle.missing] == [1]


# ---- item 16: no command line in native frames ------------------------------


def test_native_frames_leave_out_py_spys_header_with_the_command_line(tmp_path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text(
        "#!/bin/sh\n"
        "printf 'Process 4242: python train.py --wandb-key=SECRET123\\n  --more SECRET456\\n'\n"
        "printf 'Python v3.11.7 (/usr/bin/python3.11)\\n\\n'\n"
        "printf 'Thread 4242 (idle): \"MainThread\"\\n    train_loop (train.py:41)\\n'\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(agent_stacks, "_py_spy", lambda: str(fake))

    stacks = take_stacks("stk-1", "agent", 0, threading.get_ident(), native=True)

    assert stacks.native is not None and stacks.native.startswith('Thread 4242 (idle): "MainThread"')
    assert "SECRET" not in stacks.model_dump_json()
    assert "train_loop (train.py:41)" in stacks.native


def test_a_failing_py_spy_says_why_without_its_standard_output(tmp_path, monkeypatch):
    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\nprintf 'Process 1: python --token=SECRET\\n'\necho 'Permission denied' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(agent_stacks, "_py_spy", lambda: str(fake))

    stacks = take_stacks("stk-1", "agent", 0, threading.get_ident(), native=True)

    assert stacks.native is None and "Permission denied" in (stacks.native_note or "")
    assert "ptrace" in stacks.native_note and "SECRET" not in stacks.native_note
