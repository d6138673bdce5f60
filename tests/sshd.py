"""A throwaway sshd on 127.0.0.1 for `ssh://` tests and benchmarks: its own host key, one client
key, a client config with the alias `klbr-test`; started with `-D` and stopped by its owner."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")


class Sshd:
    def __init__(self, where: Path):
        self.where = where
        # The machine's ssh-keygen, by name, as ssh itself is run.
        for key in ("host_key", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(where / key)], check=True)  # noqa: S607
        (where / "authorized_keys").write_text((where / "id.pub").read_text())
        os.makedirs("/run/sshd", exist_ok=True)  # its privilege separation directory
        self.process = None
        for _ in range(5):  # a free port, taken again by someone between our probe and sshd: retry
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            if self._start():
                break
        else:
            raise RuntimeError("sshd did not start")
        host_key = (where / "host_key.pub").read_text().split()
        (where / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_key[0]} {host_key[1]}\n")
        self.config = where / "ssh_config"
        self.config.write_text(
            "Host klbr-test\n  HostName 127.0.0.1\n"
            f"  Port {self.port}\n  User root\n  IdentityFile {where / 'id'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {where / 'known_hosts'}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n")

    def _start(self) -> bool:
        config = self.where / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.where / 'host_key'}",
            f"AuthorizedKeysFile {self.where / 'authorized_keys'}", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password", "StrictModes no",
            "UsePAM no", "PidFile none", "AllowStreamLocalForwarding yes", "LogLevel INFO", ""]))
        self.process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            if "Server listening on" in line:
                # read on, or sshd blocks on a full pipe after a few hundred connections' lines
                threading.Thread(target=self.process.stderr.read, daemon=True).start()
                return True
            if "Address already in use" in line or "Cannot bind" in line:
                break
        self.process.kill()
        self.process.wait()
        return False

    def sessions(self) -> list[int]:
        """The sshd processes serving connections (children of the listening one)."""
        return [pid for pid in _children(self.process.pid)
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sshd:")]

    def stop(self) -> None:
        for pid in self.sessions():
            signal_quietly(pid, signal.SIGCONT)
        self.process.terminate()
        self.process.wait()


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
