"""The memory measure of a session host (``runtime.host_memory_mib``, ``sessionray_host_memory_bytes``)."""

from __future__ import annotations

from actors.placement.hosts.support import process_uss_mib


def test_uss_of_this_process_is_measured_and_an_unknown_pid_reads_zero() -> None:
    before = process_uss_mib()
    block = bytearray(64 * 1024 * 1024)  # 64 MiB of private, dirty pages
    block[::4096] = b"x" * len(block[::4096])
    after = process_uss_mib()
    assert before > 10 and after - before >= 60
    assert process_uss_mib(2**22 + 12345) == 0.0
