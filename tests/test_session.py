"""One kernel session toward the frontend, and nothing of the workers' own lifecycle leaks (semantics 10)."""

from __future__ import annotations

from utils import (
    collect,
    drain,
    execute,
    misbehaving,
    raw_socket,
    receive,
    results,
    standby,
    start_kernel,
    stream_text,
    until,
)


def test_every_message_carries_one_session_across_generations():
    with start_kernel() as (km, kc):
        seen: list[dict] = []  # every iopub message, whatever request it is about
        execute(kc, "print('one')", seen=seen)
        execute(kc, "import os; os.kill(os.getpid(), 9)", seen=seen)  # a new generation
        execute(kc, "print('two')", seen=seen)
        for msg_id in (kc.complete("pri", 3), kc.inspect("print", 5)):
            collect(kc, msg_id, seen=seen)
        seen += drain(kc.iopub_channel) + drain(kc.shell_channel)
    replies = [m for m in seen if m["msg_type"].endswith("_reply")]
    assert len(replies) == 5
    assert {m["header"]["session"] for m in seen} == {replies[0]["header"]["session"]}
    states = {m["content"].get("execution_state") for m in seen if m["msg_type"] == "status"}
    assert states == {"busy", "idle"}  # never `starting`, `restarting` or `dead`


def test_a_late_subscriber_gets_the_proxys_own_welcome_only(kernel):
    """New generations start while this subscriber is attached (a restart, and the spare that follows
    it): their workers' iopub_welcome and `starting` status stay with the proxy."""
    km, kc = kernel
    with raw_socket(km, "iopub") as (sock, session):
        assert receive(sock, session)["msg_type"] == "iopub_welcome"
        execute(kc, "%klbr restart")
        until(lambda: standby(kc) == "ready", 60, "the new spare is ready")
        execute(kc, "1")
        seen = []
        while sock.poll(300):
            _, frames = session.feed_identities(sock.recv_multipart())
            seen.append(session.deserialize(frames))
    assert seen, "the subscriber saw the cells' messages"
    assert "iopub_welcome" not in {m["msg_type"] for m in seen}, "no worker's iopub_welcome reaches the frontend"
    assert all(m["content"].get("execution_state") != "starting" for m in seen)


def _about_no_request(seen: list[dict]) -> list[dict]:
    """Messages that answer nothing this client sent (this client is the kernel's only one)."""
    return [m for m in seen if m["msg_type"] != "iopub_welcome" and not m["parent_header"].get("msg_id")]


def test_workers_that_serve_no_request_never_publish_to_the_frontend(tmp_path):
    """The noisy worker prints to stderr about no request soon after it starts: generation 1, its
    warm spare, and the spare started after a loss. Each line goes to the kernel's log, none to iopub."""
    log = tmp_path / "kernel.log"
    noise = "printed: klbr-test: a worker's news about no request at all"

    def noisy(generation: int) -> bool:
        return any(noise in line and f"generation {generation} " in line for line in log.read_text().splitlines())

    with misbehaving("noisy", "--KlbrKernelApp.log_level=INFO", log=log) as (km, kc):
        seen: list[dict] = []
        until(lambda: noisy(1), 30, "generation 1 has printed its noise")
        execute(kc, "1", seen=seen)
        until(lambda: noisy(2), 30, "the spare, generation 2, has printed its noise")
        reply, _ = execute(kc, "import os; os.kill(os.getpid(), 9)", seen=seen)
        assert reply["content"]["ename"] == "WorkerLost"
        until(lambda: noisy(3), 30, "the spare after the loss, generation 3, has printed its noise")
        reply, outputs = execute(kc, "print('after')", seen=seen)
        assert stream_text(outputs) == "after\n"
        seen += drain(kc.iopub_channel)
    assert not _about_no_request(seen)


def test_a_real_worker_s_start_up_noise_stays_out_of_the_notebook(tmp_path):
    """A real worker prints as it starts, with no parent (ipykernel's debugpy warns on stderr; here
    each also runs a start-up line that prints, so every one surely does): at the first generation,
    its spare, and the next spare after a loss, none of it reaches the frontend, and all of it goes to
    the kernel's log."""
    log = tmp_path / "kernel.log"
    noise = "klbr-test: a real worker's start-up noise"

    def printed(generation: int) -> bool:
        return any(noise in line and f"generation {generation} " in line for line in log.read_text().splitlines())

    startup = f"--IPKernelApp.exec_lines=import sys; print({noise!r}, file=sys.stderr)"
    with start_kernel(extra_arguments=["--KlbrKernelApp.log_level=INFO", startup], log=log) as (km, kc):
        seen: list[dict] = []
        for code in ("print('one')", "import os; os.kill(os.getpid(), 9)", "print('two')"):
            execute(kc, code, seen=seen)
            until(lambda: standby(kc, seen) == "ready", 60, "the spare is ready")  # it has started, and printed
        # Each waits for the proxy's subscription before its start-up code runs (the bootstrap's
        # `start_up_output_waits`): generation 1 too, started before the proxy's own imports.
        for generation in (1, 2, 3):
            until(lambda n=generation: printed(n), 30, f"generation {generation} has printed its noise")
        seen += drain(kc.iopub_channel)
    assert not _about_no_request(seen)


def test_the_kernel_serves_over_ipc_too(tmp_path):
    with start_kernel(manager={"transport": "ipc", "ip": str(tmp_path / "klbr-ipc")}) as (km, kc):
        reply, outputs = execute(kc, "print('over ipc')")
        assert reply["content"]["status"] == "ok"
        assert stream_text(outputs) == "over ipc\n"
        _, outputs = execute(kc, "6 * 7")
        assert results(outputs) == ["42"]
